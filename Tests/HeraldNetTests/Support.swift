import HeraldTestSupport
import HeraldNet

func ip(_ text: String) -> IPAddress {
    guard let address = IPAddress(numericHost: text) else { fatalError("bad test address \(text)") }
    return address
}

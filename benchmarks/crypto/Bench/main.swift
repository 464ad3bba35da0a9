// herald-bench-crypto: what one Web Push seal and one ES256 signature cost
// on this machine, next to the cheapest OpenSSL key-generation + ECDH loop
// measured in the same process. Prints figures; asserts nothing.
import CCryptoFloor
import Dispatch
import Foundation
import HeraldCrypto

let subscriptions = 500
let rounds = 9
let plaintext = Array(#"{"kind":"notification","data":{"conversation":"c_8f14e45fceea167a"},"badge":3}"#.utf8)

func microseconds(_ duration: Duration) -> Double {
    let (s, atto) = duration.components
    return Double(s) * 1e6 + Double(atto) / 1e12
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted[sorted.count / 2]
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("herald-bench-crypto: \(message)\n".utf8))
    exit(1)
}

// 500 prepared subscriptions, as one message's fan-out would have.
let subscribers: [WebPushSubscriber] = (0..<subscriptions).map { _ in
    do {
        let ua = try P256PrivateKey.generate()
        return try WebPushSubscriber(p256dh: ua.publicKey, auth: SecureRandom.bytes(16))
    } catch { fail("subscriber setup: \(error)") }
}
let peer = subscribers[0].publicKey

/// Seals every subscription once with one sealer; µs per seal.
func sealPass(_ sealer: WebPushSealer, _ subs: ArraySlice<WebPushSubscriber>) -> Double {
    let clock = ContinuousClock()
    var sink: UInt8 = 0
    let elapsed = clock.measure {
        for sub in subs {
            guard let body = try? sealer.seal(plaintext, for: sub) else { fail("seal failed") }
            sink ^= body[100]
        }
    }
    if sink == 0xff { print("") }  // keep the work observable
    return microseconds(elapsed) / Double(subs.count)
}

// One core: median of several passes over the 500 subscriptions, with the
// floor measured between them so both see the same machine state.
guard let sealer = try? WebPushSealer() else { fail("sealer") }
_ = sealPass(sealer, subscribers[...])  // warm-up
var sealRuns: [Double] = []
var evpRuns: [Double] = []
var pointRuns: [Double] = []
for _ in 0..<rounds {
    sealRuns.append(sealPass(sealer, subscribers[...]))
    evpRuns.append(peer.withUnsafeBufferPointer { cfloor_evp_us($0.baseAddress, Int32(subscriptions)) })
    pointRuns.append(
        peer.withUnsafeBufferPointer { cfloor_ec_point_us($0.baseAddress, Int32(subscriptions)) })
}
if evpRuns.contains(where: { $0 < 0 }) || pointRuns.contains(where: { $0 < 0 }) {
    fail("floor loop failed")
}
let sealUS = median(sealRuns)
let evpFloorUS = median(evpRuns)
let pointFloorUS = median(pointRuns)
let floorUS = min(evpFloorUS, pointFloorUS)

// All cores: each worker has its own sealer and seals its share of the 500,
// repeated; the figure is wall time per seal for the whole fan-out.
let cores = ProcessInfo.processInfo.activeProcessorCount
func parallelPass(repeats: Int) -> Double {
    let share = (subscriptions + cores - 1) / cores
    let clock = ContinuousClock()
    let elapsed = clock.measure {
        DispatchQueue.concurrentPerform(iterations: cores) { worker in
            guard let own = try? WebPushSealer() else { fail("sealer") }
            let lo = worker * share
            let hi = min(subscriptions, lo + share)
            guard lo < hi else { return }
            for _ in 0..<repeats { _ = sealPass(own, subscribers[lo..<hi]) }
        }
    }
    return microseconds(elapsed) / Double(subscriptions * repeats)
}
_ = parallelPass(repeats: 1)
let parallelUS = median((0..<rounds).map { _ in parallelPass(repeats: 2) })

// ES256: signatures per second over 32-byte messages (JWT signing inputs are
// hashed first, as in a real token).
guard let signer = try? P256PrivateKey.generate() else { fail("signing key") }
let message = Array(repeating: UInt8(0x5a), count: 32)
var signRates: [Double] = []
for _ in 0..<5 {
    let n = 4000
    let clock = ContinuousClock()
    let elapsed = clock.measure {
        for _ in 0..<n { _ = try? signer.sign(message) }
    }
    signRates.append(Double(n) / (microseconds(elapsed) / 1e6))
}
let signsPerSecond = median(signRates)

let report: [String: Any] = [
    "subscriptions": subscriptions,
    "body_bytes": WebPushSealer.defaultBodySize,
    "plaintext_bytes": plaintext.count,
    "seal_us": sealUS,
    "floor_us": floorUS,
    "floor_evp_us": evpFloorUS,
    "floor_ec_point_us": pointFloorUS,
    "ratio": sealUS / floorUS,
    "cores": cores,
    "seal_all_cores_us": parallelUS,
    "core_scaling": sealUS / parallelUS,
    "es256_signs_per_s": signsPerSecond,
]

if CommandLine.arguments.count > 2, CommandLine.arguments[1] == "--json" {
    guard let data = try? JSONSerialization.data(withJSONObject: report, options: [.sortedKeys])
    else { fail("json") }
    guard FileManager.default.createFile(atPath: CommandLine.arguments[2], contents: data) else {
        fail("cannot write \(CommandLine.arguments[2])")
    }
}
func f(_ v: Double, _ digits: Int = 1) -> String { String(format: "%.\(digits)f", v) }
print(
    "seal, 1 core:            \(f(sealUS)) µs per seal (median of \(rounds) passes over \(subscriptions) subscriptions)"
)
print("floor (keygen + ECDH):   \(f(floorUS)) µs  [EVP \(f(evpFloorUS)) µs, EC_POINT \(f(pointFloorUS)) µs]")
print("seal / floor:            \(f(sealUS / floorUS, 3))")
print(
    "seal, \(cores) cores:           \(f(parallelUS)) µs per seal of wall time (scaling \(f(sealUS / parallelUS, 2))x)")
print("ES256 signs per second:  \(f(signsPerSecond, 0))")

import HeraldCore

/// One lane's transport when its registrations may take either form: a
/// Web Push-form registration (it has keys) goes to the app's Web Push
/// sender, whatever its platform; a raw-token one to the platform's own
/// transport (APNs, FCM). `unified_push` lanes have only the Web Push side.
final class FormRoutedTransport: PushTransport {
    let legacy: (any PushTransport)?
    let webPush: (any PushTransport)?

    init(legacy: (any PushTransport)?, webPush: (any PushTransport)?) {
        self.legacy = legacy
        self.webPush = webPush
    }

    var concurrencyLimit: Int { max(legacy?.concurrencyLimit ?? 0, webPush?.concurrencyLimit ?? 0) }

    func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        guard let transport = job.keys != nil ? webPush : legacy else {
            // The queue skips these when the message is accepted; one claimed
            // after a reload turned its transport off ends here.
            completion(AttemptReport(outcome: .failed(reason: Self.transportDisabled)))
            return
        }
        transport.send(job, completion: completion)
    }

    static let transportDisabled = ProviderReason("transport_disabled")
}

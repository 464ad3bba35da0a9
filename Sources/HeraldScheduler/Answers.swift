import HeraldCore
import HeraldIO
import HeraldStore

/// What a transport answered for one job, with where it was sent.
struct Answer: Sendable {
    let job: DeliveryJob
    let lane: QueueLane
    /// The Web Push origin whose slot the job holds; nil for APNs and FCM.
    let origin: String?
    let report: AttemptReport
    /// Microseconds from the hand-over to the answer.
    let elapsed: Int64
}

/// The transports' answers on their way to the engine: posted on the
/// transports' threads, taken on the engine's queue. One dispatch onto the
/// queue carries every answer posted until it runs, not one each: a fan-out's
/// answers come in bursts (one read of a connection holds dozens), and a
/// dispatch that wakes the queue costs more than judging an answer.
final class AnswerInbox: Sendable {
    private let box = Locked<[Answer]>([])

    /// Adds an answer; true when the inbox was empty, and the caller then
    /// dispatches the take.
    func post(_ answer: Answer) -> Bool {
        box.withLock {
            $0.append(answer)
            return $0.count == 1
        }
    }

    /// Every answer posted so far, oldest first.
    func take() -> [Answer] {
        box.withLock {
            var out: [Answer] = []
            swap(&out, &$0)
            return out
        }
    }
}

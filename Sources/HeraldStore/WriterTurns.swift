/// Which of the writer's waiting jobs go into its next transaction.
///
/// Acceptances first: when jobs that acknowledge a caller's durable write
/// (`push.send`, `device.register` and the other calls submitted
/// `durable`) wait behind the engine's bulk work (claims of up to a
/// thousand rows, result batches, purges), the next transaction takes them
/// alone, in their order, so that a call is answered after the transaction
/// already running, not after the bulk queued before it. The turn after
/// such a transaction takes the queue in order, so bulk work never starves:
/// at most every other transaction is one of acceptances only.
///
/// Moving an acceptance ahead of bulk work queued earlier changes no
/// outcome a caller could tell: the two were concurrent (a claim does not
/// see a message committed after it started, a result does not depend on
/// a registration), and a fenced read stays behind the write it waits for
/// (writes only move earlier).
struct WriterTurns {
    /// Whether the last transaction took acceptances out of turn.
    private var tookAcceptances = false

    mutating func next<Call>(from queue: inout [Call], max: Int, isAcceptance: (Call) -> Bool) -> [Call] {
        if !tookAcceptances, let bulk = queue.firstIndex(where: { !isAcceptance($0) }),
            queue[bulk...].contains(where: isAcceptance)
        {
            var batch: [Call] = []
            var rest: [Call] = []
            rest.reserveCapacity(queue.count)
            for call in queue {
                if batch.count < max && isAcceptance(call) { batch.append(call) } else { rest.append(call) }
            }
            queue = rest
            tookAcceptances = true
            return batch
        }
        tookAcceptances = false
        let take = min(queue.count, max)
        let batch = Array(queue.prefix(take))
        queue.removeFirst(take)
        return batch
    }
}

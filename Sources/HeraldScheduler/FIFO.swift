/// A first-in, first-out list whose `popFirst` is O(1): the jobs waiting for
/// a lane's or an origin's slot. An array with `removeFirst` moves every
/// element left behind the first (and, held in a dictionary, copied the
/// whole list first): with a thousand jobs waiting, each freed slot cost a
/// thousand moves and their retains.
struct FIFO<Element> {
    private var items: [Element] = []
    /// Index of the first element not yet taken.
    private var head = 0

    init() {}

    var isEmpty: Bool { head == items.count }
    var count: Int { items.count - head }

    mutating func append(_ element: Element) {
        items.append(element)
    }

    /// Takes the first element; the taken prefix is dropped once it is at
    /// least half of the storage (amortized O(1)).
    mutating func popFirst() -> Element? {
        guard head < items.count else { return nil }
        let first = items[head]
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64 && head * 2 >= items.count {
            items.removeFirst(head)
            head = 0
        }
        return first
    }

    /// The elements not yet taken, first first.
    var elements: ArraySlice<Element> { items[head...] }

    /// Keeps the elements for which `keep` is true, in order.
    mutating func removeAll(where remove: (Element) -> Bool) {
        items = items[head...].filter { !remove($0) }
        head = 0
    }
}

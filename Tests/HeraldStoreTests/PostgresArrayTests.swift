import Testing

@testable import HeraldStore

@Suite("PostgreSQL array parameters")
struct PostgresArrayTests {
    @Test("a text array quotes every value, escapes quotes and backslashes, writes nil as NULL and a NUL as U+FFFD")
    func textArray() {
        let values: [String?] = ["a", nil, "q\"b\\c", "é😀", "x\0y", "", "NULL"]
        #expect(
            PostgresQueue.textArray(values)
                == "{\"a\",NULL,\"q\\\"b\\\\c\",\"é😀\",\"x\u{FFFD}y\",\"\",\"NULL\"}")
        #expect(PostgresQueue.textArray([]) == "{}")
    }
}

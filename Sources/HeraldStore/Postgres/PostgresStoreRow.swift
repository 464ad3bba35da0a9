import Postgres

/// A PostgreSQL row read by the store's rules (see ``StoreRow``).
extension PostgresRow: StoreRow {
    func clientText(_ column: Int) throws -> String { String(decoding: try bytes(column), as: UTF8.self) }
    func optionalClientText(_ column: Int) throws -> String? {
        try optionalBytes(column).map { String(decoding: $0, as: UTF8.self) }
    }
    func optionalFlag(_ column: Int) throws -> Bool? { try optionalBool(column) }
}

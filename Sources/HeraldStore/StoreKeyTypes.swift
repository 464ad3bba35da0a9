public import HeraldCrypto

/// The store key as the daemon found it, for `StoreLocation.open`.
public enum StoreKeySupply {
    /// Read from the key file.
    case key(StoreKey)
    /// There is no key file: `create` writes one and returns it. The store
    /// calls it only for a database that holds no data.
    case missing(create: () throws -> StoreKey)
}

/// What the store did with its key when it opened.
public enum StoreKeyOutcome: Sendable, Equatable {
    /// The key opened the check value the database records.
    case verified
    /// The database had no check value (it predates it, or it is new): the
    /// key opened one of its sealed rows (or it had none), and its check
    /// value is now recorded. `sealedRows` is how many device rows it holds.
    case recorded(sealedRows: Int)
    /// The database held no data and there was no key file: a new key was
    /// created and its check value recorded.
    case created
}

/// The store key does not belong to the database; the daemon must not start.
/// Its description names the key file and the database, never the key.
public struct StoreKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Problem: Sendable, Equatable {
        /// The check value the database records does not open with the key.
        case checkValueDoesNotOpen
        /// A database from before check values: it holds sealed device rows
        /// and not one of them opens with the key.
        case noSealedRowOpens(devices: Int)
        /// There is no key file, and the database holds data.
        case keyMissing(devices: Int, messages: Int, deliveries: Int)
        /// There is no key file, and the shared database already records a
        /// key (another instance made it).
        case keyRecordedElsewhere
    }

    public let problem: Problem
    public let keyFile: String
    public let database: String

    public init(_ problem: Problem, keyFile: String, database: String) {
        self.problem = problem
        self.keyFile = keyFile
        self.database = database
    }

    public var description: String {
        switch problem {
        case .checkValueDoesNotOpen:
            return "the store key \(keyFile) does not open the database \(database) (it is not the key the "
                + "database was sealed with): restore the key file that belongs to this database, "
                + "or move the database aside to start with an empty one"
        case .noSealedRowOpens(let devices):
            return "the store key \(keyFile) does not open the database \(database) (none of its \(devices) "
                + "sealed device rows opens with it): restore the key file that belongs to this database, "
                + "or move the database aside to start with an empty one"
        case .keyMissing(let devices, let messages, let deliveries):
            return "the store key \(keyFile) is missing but the database \(database) holds data "
                + "(\(devices) devices, \(messages) messages, \(deliveries) deliveries); a new key is created "
                + "only for an empty database: restore the key file from its backup, "
                + "or move the database aside to start with an empty one"
        case .keyRecordedElsewhere:
            return "the store key \(keyFile) is missing but the shared database \(database) already records a "
                + "store key (another instance made it): copy that instance's key file here; every instance "
                + "on one database needs the same key"
        }
    }
}

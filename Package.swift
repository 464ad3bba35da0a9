// swift-tools-version:6.0
import PackageDescription

let strictSwift: [SwiftSetting] = [
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("ExistentialAny"),
]

/// The C core is held to the same rules whether SwiftPM or the Makefile builds it.
let strictC: [CSetting] = [
    .define("OPENSSL_API_COMPAT", to: "30000"),
    .define("OPENSSL_NO_DEPRECATED"),
    .unsafeFlags(["-Wall", "-Wextra", "-Werror"]),
]

let package = Package(
    name: "herald",
    products: [
        .executable(name: "herald", targets: ["herald"]),
        .executable(name: "herald-bench-crypto", targets: ["HeraldBenchCrypto"]),
    ],
    targets: [
        .target(
            name: "CHeraldCrypto",
            path: "CSources/CHeraldCrypto",
            cSettings: strictC,
            linkerSettings: [
                .linkedLibrary("crypto"), .linkedLibrary("sodium"), .linkedLibrary("jansson"),
            ]
        ),
        .target(
            name: "HeraldCrypto",
            dependencies: ["CHeraldCrypto"],
            swiftSettings: strictSwift
        ),
        .executableTarget(
            name: "herald",
            dependencies: ["HeraldCrypto"],
            swiftSettings: strictSwift
        ),
        .target(
            name: "CCryptoFloor",
            path: "benchmarks/crypto/CFloor",
            cSettings: strictC,
            linkerSettings: [.linkedLibrary("crypto")]
        ),
        .executableTarget(
            name: "HeraldBenchCrypto",
            dependencies: ["HeraldCrypto", "CCryptoFloor"],
            path: "benchmarks/crypto/Bench",
            swiftSettings: strictSwift
        ),
        .testTarget(
            name: "HeraldCryptoTests",
            dependencies: ["HeraldCrypto"],
            swiftSettings: strictSwift
        ),
        .testTarget(
            name: "HeraldCLITests",
            dependencies: ["herald", "HeraldCrypto"],
            swiftSettings: strictSwift
        ),
    ],
    swiftLanguageModes: [.v6]
)

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
            name: "CHeraldCurl",
            path: "CSources/CHeraldCurl",
            cSettings: strictC,
            linkerSettings: [.linkedLibrary("curl")]
        ),
        .target(name: "HeraldNet", dependencies: ["HeraldCore", "HeraldIO", "CAres"], swiftSettings: strictSwift),
        .target(
            name: "HTTPClient", dependencies: ["CHeraldCurl", "CHeraldSys", "HeraldIO", "HeraldNet"],
            swiftSettings: strictSwift),
        .target(
            name: "CHeraldH2",
            path: "CSources/CHeraldH2",
            cSettings: strictC,
            linkerSettings: [.linkedLibrary("nghttp2"), .linkedLibrary("ssl"), .linkedLibrary("crypto")]
        ),
        .target(
            name: "CHeraldHTTPD",
            path: "CSources/CHeraldHTTPD",
            cSettings: strictC,
            linkerSettings: [.linkedLibrary("microhttpd")]
        ),
        .target(name: "HeraldIO", dependencies: ["CHeraldSys"], swiftSettings: strictSwift),
        .target(
            name: "CHeraldSys",
            path: "CSources/CHeraldSys",
            cSettings: strictC
        ),
        .systemLibrary(name: "CSQLite", path: "CSources/CSQLite"),
        .systemLibrary(name: "CInih", path: "CSources/CInih"),
        .systemLibrary(name: "CAres", path: "CSources/CAres", providers: [.apt(["libc-ares-dev"])]),
        .systemLibrary(name: "CLibPQ", path: "CSources/CLibPQ", providers: [.apt(["libpq-dev"])]),
        .target(name: "Postgres", dependencies: ["CLibPQ", "CHeraldSys", "HeraldIO"], swiftSettings: strictSwift),
        .target(
            name: "HeraldCrypto",
            dependencies: ["CHeraldCrypto", "HeraldIO"],
            swiftSettings: strictSwift
        ),
        .target(name: "HeraldCore", swiftSettings: strictSwift),
        .target(name: "HeraldJSON", swiftSettings: strictSwift),
        .target(name: "HeraldTime", swiftSettings: strictSwift),
        .target(name: "JSONRPC", dependencies: ["HeraldJSON"], swiftSettings: strictSwift),
        .target(
            name: "WebPush",
            dependencies: [
                "HeraldCore", "HeraldJSON", "HeraldCrypto", "HeraldIO", "HeraldNet", "HeraldTransport",
            ],
            swiftSettings: strictSwift),
        .target(name: "HeraldDelivery", dependencies: ["HeraldCore"], swiftSettings: strictSwift),
        .target(
            name: "HeraldScheduler",
            dependencies: ["HeraldCore", "HeraldDelivery", "HeraldStore", "HeraldIO", "HeraldNet"],
            swiftSettings: strictSwift),
        .target(
            name: "HTTP2", dependencies: ["HeraldCore", "HeraldIO", "CHeraldH2", "CHeraldSys", "HeraldNet"],
            swiftSettings: strictSwift),
        .target(
            name: "HeraldTransport", dependencies: ["HeraldCore", "HeraldIO", "HeraldNet", "HTTP2", "HTTPClient"],
            swiftSettings: strictSwift),
        .target(
            name: "APNs",
            dependencies: ["HeraldCore", "HeraldJSON", "HeraldCrypto", "HeraldIO", "HeraldNet", "HTTP2"],
            swiftSettings: strictSwift),
        .target(
            name: "FCM",
            dependencies: [
                "HeraldCore", "HeraldJSON", "HeraldCrypto", "HeraldIO", "HeraldNet", "HeraldTransport",
            ],
            swiftSettings: strictSwift),
        .target(
            name: "HeraldStore",
            dependencies: [
                "HeraldCore", "HeraldCrypto", "HeraldJSON", "CSQLite", "CHeraldSys", "Postgres", "HeraldIO",
                "HeraldTime",
            ],
            swiftSettings: strictSwift
        ),
        .target(
            name: "HeraldConfiguration",
            dependencies: ["HeraldCore", "HeraldIO", "HeraldNet", "HeraldCrypto", "Postgres", "CInih"],
            swiftSettings: strictSwift
        ),
        .target(
            name: "HeraldDaemon",
            dependencies: [
                "HeraldCore", "HeraldCrypto", "HeraldJSON", "JSONRPC", "WebPush", "HeraldStore", "HeraldConfiguration",
                "CHeraldSys", "HeraldIO", "APNs", "FCM", "HTTPClient", "HeraldDelivery", "HeraldScheduler",
                "CHeraldHTTPD", "HTTP2", "Postgres", "HeraldNet", "HeraldTransport", "HeraldTime",
            ],
            swiftSettings: strictSwift
        ),
        .executableTarget(
            name: "herald",
            dependencies: [
                "HeraldCrypto", "HeraldDaemon", "HeraldConfiguration", "HeraldJSON", "JSONRPC", "HeraldIO", "HeraldNet",
            ],
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
            dependencies: ["HeraldCrypto", "HeraldTestSupport"],
            swiftSettings: strictSwift
        ),
        .target(
            name: "HeraldTestSupport", dependencies: ["HTTPClient", "HeraldCore", "HeraldIO", "HeraldNet"],
            path: "Tests/HeraldTestSupport",
            swiftSettings: strictSwift),
        .testTarget(
            name: "HTTPClientTests", dependencies: ["HTTPClient", "HeraldTestSupport"], swiftSettings: strictSwift),
        .testTarget(
            name: "APNsTests", dependencies: ["APNs", "HeraldCore", "HeraldCrypto", "HeraldTestSupport", "HeraldIO"],
            swiftSettings: strictSwift),
        .testTarget(name: "HeraldJSONTests", dependencies: ["HeraldJSON"], swiftSettings: strictSwift),
        .testTarget(name: "JSONRPCTests", dependencies: ["JSONRPC", "HeraldJSON"], swiftSettings: strictSwift),
        .testTarget(
            name: "WebPushTests", dependencies: ["WebPush", "HeraldCore", "HeraldNet", "HeraldTestSupport"],
            swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldNetTests", dependencies: ["HeraldNet", "HeraldTestSupport"], swiftSettings: strictSwift),
        .testTarget(
            name: "HTTP2Tests", dependencies: ["HTTP2", "HeraldIO", "HeraldTestSupport"], swiftSettings: strictSwift),
        .testTarget(
            name: "SenderTests",
            dependencies: [
                "FCM", "WebPush", "HTTPClient", "HTTP2", "HeraldCrypto", "HeraldCore",
                "HeraldTestSupport", "HeraldIO", "HeraldNet", "HeraldTransport",
            ],
            swiftSettings: strictSwift),
        .target(
            name: "HeraldStoreTestSupport",
            dependencies: ["HeraldStore", "HeraldCore", "HeraldCrypto", "Postgres", "HeraldTestSupport"],
            path: "Tests/HeraldStoreTestSupport", swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldSchedulerTests",
            dependencies: [
                "HeraldScheduler", "HeraldStore", "HeraldDelivery", "HeraldCore", "HeraldCrypto", "HeraldIO",
                "HeraldStoreTestSupport", "HeraldTestSupport",
            ],
            swiftSettings: strictSwift),
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore"], swiftSettings: strictSwift),
        .testTarget(name: "HeraldTimeTests", dependencies: ["HeraldTime"], swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldDeliveryTests", dependencies: ["HeraldDelivery", "HeraldCore", "HeraldTestSupport"],
            swiftSettings: strictSwift),
        .testTarget(
            name: "TransportPayloadTests", dependencies: ["APNs", "FCM", "WebPush", "HeraldCore", "HeraldJSON"],
            swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldStoreTests",
            dependencies: [
                "HeraldStore", "HeraldCrypto", "HeraldCore", "CSQLite", "HeraldTestSupport", "HeraldStoreTestSupport",
                "Postgres",
            ],
            swiftSettings: strictSwift
        ),
        .testTarget(
            name: "PostgresTests", dependencies: ["Postgres", "HeraldTestSupport", "HeraldIO"],
            swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldDaemonTests",
            dependencies: [
                "HeraldDaemon", "HeraldCore", "HeraldJSON", "JSONRPC", "herald", "HeraldTestSupport", "HeraldStore",
                "HeraldCrypto",
                "HeraldStoreTestSupport", "HeraldIO", "WebPush", "HeraldNet", "HeraldConfiguration",
            ],
            swiftSettings: strictSwift
        ),
        .testTarget(
            name: "PushDeliveryTests", dependencies: ["HeraldCrypto", "HeraldTestSupport", "herald"],
            swiftSettings: strictSwift),
        .testTarget(
            name: "HeraldCLITests",
            dependencies: ["herald", "HeraldCrypto", "HeraldTestSupport"],
            swiftSettings: strictSwift
        ),
    ],
    swiftLanguageModes: [.v6]
)

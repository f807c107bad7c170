//! The process-wide `[rpc]` settings (own test binary: they are global).

use fskv_rpc::settings::{self, RpcSettings};
use fskv_rpc::{CallOptions, ClientConfig, ServerConfig};

#[test]
fn defaults_follow_the_installed_settings_and_only_the_first_install_counts() {
    assert_eq!(ClientConfig::default().connections_per_addr, RpcSettings::BUILT_IN.connections_per_peer);
    let mine = RpcSettings {
        max_frame_bytes: 1 << 20,
        connections_per_peer: 2,
        max_in_flight_per_connection: 16,
        connect_timeout_ms: 250,
        default_call_timeout_ms: 1_234,
        max_connections: 10,
        max_in_flight_bytes: 4 << 20,
        frame_read_timeout_ms: 500,
        idle_timeout_ms: 900,
        handshake_timeout_ms: 321,
        max_unauthenticated_connections: 7,
    };
    assert!(settings::install(mine.clone()));
    assert!(!settings::install(RpcSettings::BUILT_IN), "a second install is refused");
    assert_eq!(settings::current(), &mine);
    let c = ClientConfig::default();
    assert_eq!((c.connections_per_addr, c.max_frame_bytes, c.max_in_flight_per_connection, c.connect_timeout_ms), (2, 1 << 20, 16, 250));
    let s = ServerConfig::default();
    assert_eq!((s.max_frame_bytes, s.max_in_flight_per_connection), (1 << 20, 16));
    assert_eq!((s.max_connections, s.max_in_flight_bytes, s.frame_read_timeout_ms, s.idle_timeout_ms), (10, 4 << 20, 500, 900));
    assert_eq!(CallOptions::default().timeout_ms, 1_234);
    assert_eq!((c.handshake_timeout_ms, s.handshake_timeout_ms), (321, 321));
    assert_eq!(s.max_unauthenticated_connections, 7);
}

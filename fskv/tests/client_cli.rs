//! `fskv admin status`, `fskv put` and `fskv get` against a running `fskv up`
//! (one cluster start for all three, to keep the test short).

mod common;

use common::{free_base_port, fskv_ok as fskv, start_up, stop_up};

#[test]
fn admin_status_and_put_get_round_trip_against_up() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base_port();
    let up = start_up(&dir.path().join("data"), base);
    let mgmtd = format!("127.0.0.1:{}", base + 11);
    let meta = format!("127.0.0.1:{}", base + 12);

    // Status as JSON: 3 live nodes, every target of every chain serving, space known.
    let out = fskv(&["admin", "status", "--mgmtd", &mgmtd, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let nodes = v["mgmtd"]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3, "{v:#}");
    assert!(nodes.iter().all(|n| n["alive"] == true), "{v:#}");
    let chains = v["mgmtd"]["chains"].as_array().expect("chains");
    assert!(!chains.is_empty());
    for c in chains {
        for t in c["targets"].as_array().expect("targets") {
            assert_eq!(t["public"], "serving", "chain {}: {t}", c["chain_id"]);
        }
    }
    // The meta server registered itself with mgmtd.
    let metas = v["mgmtd"]["meta_servers"].as_array().expect("meta_servers");
    assert_eq!(metas.iter().map(|m| m["address"].as_str().unwrap_or("")).collect::<Vec<_>>(), vec![meta.as_str()], "{v:#}");
    let space = v["space"].as_array().expect("space");
    assert_eq!(space.len(), 3);
    assert!(space.iter().all(|n| n["error"].is_null() && !n["targets"].as_array().unwrap().is_empty()), "{space:?}");
    // And as text.
    let text = String::from_utf8(fskv(&["admin", "status", "--mgmtd", &mgmtd]).stdout).unwrap();
    assert!(text.contains("nodes (3):") && text.contains("serving/up-to-date") && text.contains("MiB"), "{text}");
    assert!(text.contains("meta servers (1):") && text.contains(&meta), "{text}");

    // put / get of 5 MiB + a tail, compared byte for byte.
    let data: Vec<u8> = (0..(5 << 20) + 12345u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let local = dir.path().join("in.bin");
    std::fs::write(&local, &data).unwrap();
    let back = dir.path().join("out.bin");
    let put = fskv(&["put", "--mgmtd", &mgmtd, "--meta", &meta, local.to_str().unwrap(), "/big.bin"]);
    assert!(String::from_utf8_lossy(&put.stdout).contains(&format!("{} bytes", data.len())));
    // No --meta: found through mgmtd's routing info.
    fskv(&["get", "--mgmtd", &mgmtd, "/big.bin", back.to_str().unwrap()]);
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "downloaded bytes differ");

    // A missing remote file is an error that names it.
    let out = common::fskv_cmd().args(["get", "--mgmtd", &mgmtd, "--meta", &meta, "/nope", back.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nope"), "{}", String::from_utf8_lossy(&out.stderr));
    stop_up(up);
}

//! SGLang's page spaces under `--data-dir`: spaces, sizes, bindings,
//! deletes and clears survive a restart, apart from vLLM's store (whose
//! `/clear` leaves them), after a clean close and after a crash-like close
//! (the log tail not folded).

use clap::Parser;
use hf3fs_meta::config::Config;
use hf3fs_meta::App;
use std::path::Path;
use std::time::Duration;

fn open(dir: &Path) -> App {
    let cfg = Config::parse_from([
        "hf3fs-meta",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--fsync",
        "always",
        "--data-dir",
        dir.to_str().expect("utf-8 path"),
    ]);
    App::open(cfg).unwrap_or_else(|e| panic!("open: {e}"))
}

fn sha(i: u64, suffix: &str) -> String {
    format!("{:016x}{:016x}{:016x}{:016x}{suffix}", i + 1, i * 7 + 3, !i, i)
}

/// Reserves and confirms `keys` on space `(rank, ns)`; returns the pages.
fn set(app: &App, rank: u32, ns: &str, keys: &[&str]) -> Vec<i64> {
    app.spaces
        .with(rank, ns, |st| {
            let mut slots = Vec::new();
            st.allocate_partial(0, keys, &mut slots).unwrap();
            let conf: Vec<(&str, i64)> =
                keys.iter().zip(&slots).filter(|(_, s)| !s.stored && s.page >= 0).map(|(k, s)| (*k, s.page)).collect();
            st.confirm(0, &conf, &[]).unwrap();
            slots.iter().map(|s| s.page).collect()
        })
        .expect("space exists")
}

/// Everything a client can see of the spaces: names, sizes, and where each
/// of `keys` is in each.
fn view(app: &App, keys: &[&str]) -> Vec<(u32, String, u32, Vec<Option<u32>>)> {
    app.spaces
        .list()
        .into_iter()
        .map(|(name, st)| {
            let mut loc = Vec::new();
            st.locations(0, keys, &mut loc).unwrap();
            st.audit().unwrap_or_else(|e| panic!("audit of {}:{}: {e}", name.rank, name.namespace));
            (name.rank, name.namespace.to_string(), st.rank_size(0).unwrap(), loc)
        })
        .collect()
}

fn sync(app: &App) {
    let d = app.spaces_durable.as_ref().expect("durable");
    d.sync_blocking(Duration::from_secs(30)).expect("durable");
}

fn scenario(crash: bool) {
    let dir = tempfile::tempdir().unwrap();
    let owned: Vec<String> = (0..6).map(|i| sha(i, if i % 2 == 0 { "-k" } else { "-v" })).collect();
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let before = {
        let app = open(dir.path());
        app.spaces.initialize(0, "kv", 16).unwrap();
        app.spaces.initialize(0, "mamba", 0).unwrap();
        app.spaces.initialize(3, "ns 'ключ'\n", 8).unwrap();
        set(&app, 0, "kv", &keys[..4]);
        app.spaces.with(0, "kv", |st| st.delete(0, &keys[1..2]).unwrap());
        // A clear, then keys again: only the later ones survive.
        set(&app, 3, "ns 'ключ'\n", &keys[..3]);
        app.spaces.with(3, "ns 'ключ'\n", |st| st.reset().unwrap());
        set(&app, 3, "ns 'ключ'\n", &keys[4..]);
        // vLLM's clear leaves the spaces alone.
        app.store.initialize(0, 8).unwrap();
        app.store.clear();
        sync(&app);
        let v = view(&app, &keys);
        if crash {
            app.spaces_durable.as_ref().unwrap().close_without_checkpoint().unwrap();
            app.durable.as_ref().unwrap().close_without_checkpoint().unwrap();
        } else {
            app.close().unwrap();
        }
        v
    };
    assert_eq!(before.len(), 3);
    let app = open(dir.path());
    assert_eq!(view(&app, &keys), before, "the spaces after a restart (crash: {crash})");
    let kv = &before[0].3;
    assert!(kv[0].is_some() && kv[1].is_none() && kv[2].is_some() && kv[3].is_some(), "{kv:?}");
    let ns = &before[2].3;
    assert!(ns[..4].iter().all(Option::is_none) && ns[4].is_some() && ns[5].is_some(), "{ns:?}");
    // The restored spaces go on: new keys, new spaces, and a restart again.
    set(&app, 0, "mamba", &keys[..1]);
    app.spaces.initialize(9, "kv", 4).unwrap();
    set(&app, 9, "kv", &keys[..2]);
    sync(&app);
    let again = view(&app, &keys);
    app.close().unwrap();
    drop(app);
    let app = open(dir.path());
    assert_eq!(view(&app, &keys), again);
    assert_eq!(app.spaces.len(), 4);
    app.close().unwrap();
}

#[test]
fn spaces_survive_a_clean_restart() {
    scenario(false);
}

#[test]
fn spaces_survive_a_crash_like_restart() {
    scenario(true);
}

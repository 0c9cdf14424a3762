//! With `--fsync batch`: the syncer thread, which fdatasyncs the store's
//! journal files every [`BATCH_SYNC_INTERVAL`] while there is something new.
//!
//! It syncs through file descriptors of its own: fjall's `persist` holds
//! its journal lock for the whole fsync, which would stall the writer's
//! next append; an fsync on another descriptor of the same file flushes the
//! same dirty pages without that lock. It follows the current keyspace (a
//! recovery replaces it), and a failure is a store failure like the
//! writer's ([`Shared::fail`]): nothing is acknowledged after it until a
//! recovery has rewritten everything from memory, since pages whose fsync
//! failed may never reach the disk.

use super::error::Failure;
use super::faults::Point;
use super::shared::{Shared, Who};
use crossbeam_channel::Receiver;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// With `--fsync batch`, written data is synced at most about this long
/// after it was written.
pub(crate) const BATCH_SYNC_INTERVAL: Duration = Duration::from_millis(5);

/// The syncer thread; returns when `stop` receives or disconnects.
/// `synced` is the durable position when the store was opened: the thread
/// may start after the writer has already published more, which it must
/// sync too.
pub(crate) fn run(shared: Arc<Shared>, stop: Receiver<()>, mut synced: u64) {
    let tick = crossbeam_channel::tick(BATCH_SYNC_INTERVAL);
    let mut files: HashMap<PathBuf, std::fs::File> = HashMap::new();
    loop {
        crossbeam_channel::select! {
            recv(stop) -> _ => return,
            recv(tick) -> _ => {}
        }
        let written = shared.progress.durable();
        if written == synced || !shared.progress.is_healthy() {
            // Degraded: a recovery syncs everything it writes itself.
            synced = written;
            continue;
        }
        let journals = shared.db.load().journals_dir();
        let result = {
            let _call = shared.watch.enter(Who::Syncer, Instant::now());
            shared.check(Point::Sync).and_then(|()| sync_dir_files(&journals, &mut files))
        };
        if let Err(e) = result {
            shared.fail(Failure::io(&format!("fsync of the journal in {}", journals.display()), &e));
            files.clear();
        }
        synced = written;
    }
}

/// fdatasyncs every file in `dir`, keeping the descriptors open.
fn sync_dir_files(dir: &Path, files: &mut HashMap<PathBuf, std::fs::File>) -> std::io::Result<()> {
    let present: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.path()).collect();
    files.retain(|p, _| present.contains(p));
    for p in present {
        let f = match files.entry(p) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match std::fs::File::open(v.key()) {
                Ok(f) => v.insert(f),
                // Removed since the listing (a flushed journal): nothing to sync.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
        };
        f.sync_data()?;
    }
    Ok(())
}

//! SIGINT, SIGTERM and SIGHUP: a thread waits for them (they are blocked in
//! every other thread) and removes what the current run made — every
//! process in its namespaces, the namespaces, its mounts — then exits 130.

use std::sync::Mutex;

static CURRENT: Mutex<String> = Mutex::new(String::new());

/// Names the run in progress (its tag; empty: none).
pub fn set_current(tag: &str) {
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = tag.to_string();
}

fn set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise a sigset_t we own.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut s, sig);
        }
        s
    }
}

/// Blocks the signals in the calling thread (call first in `main`, before
/// any thread starts, so that every thread inherits the mask) and starts the
/// thread that handles them.
pub fn install() {
    let s = set();
    // SAFETY: pthread_sigmask on a valid set; only this thread's mask changes.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &s, std::ptr::null_mut());
    }
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait with a valid set and an out-parameter we own.
        if unsafe { libc::sigwait(&s, &mut sig) } != 0 {
            return;
        }
        let tag = CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone();
        eprintln!("hf3fs-faults: signal {sig}: removing what the run made");
        if !tag.is_empty() {
            for r in crate::ns::cleanup(&format!("{}{tag}-", crate::ns::PREFIX), &format!("/tmp/hff-{tag}")) {
                eprintln!("  removed {r}");
            }
            let _ = std::fs::remove_dir_all(format!("/tmp/hff-{tag}"));
        }
        std::process::exit(130);
    });
}

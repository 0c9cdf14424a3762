//! Tests of the real binary as a child process: flags, signals, exit
//! statuses, SIGKILL restarts, a full disk, and the engines' Python clients.
//!
//! - [`bench`]: `hf3fs-meta bench`'s report against the server's `/metrics`.
//! - [`binary`]: start-up, flags, shutdown, the listen backlog.
//! - [`durable_crash`]: SIGKILL under load, then restarts.
//! - [`durable_disk`]: a full disk (a small tmpfs when run as root).
//! - [`formats`]: data directories across releases: the format marker, a
//!   newer format refused untouched, older directories opened.
//! - [`never_a_wrong_page`]: the "never a wrong page" sequences on the hidden test clock,
//!   SIGKILL restarts included, against a simulated page store.
//! - [`tenants`]: `--tenants`: a bad file refused, SIGHUP reloads, a tenant's listen address.
//! - [`tools`]: `hf3fs-meta inspect` and `verify` on data directories.
//! - [`python_client`]: the Python suites in tests/python, the engines' own
//!   clients (read out of their wheels at test time) included.

// A test or bench binary has no API: its `pub` items are crate-local.
#![allow(unreachable_pub)]

mod bench;
mod binary;
mod durable_crash;
mod durable_disk;
mod formats;
mod never_a_wrong_page;
mod python_client;
mod tenants;
mod tools;

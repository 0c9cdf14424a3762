//! The network of a run: a hub namespace holding a bridge, and one namespace
//! per process on a private /24 that exists only inside these namespaces.
//!
//! Every name starts with [`PREFIX`], so `--cleanup` finds the leftovers of a
//! run that died. The root namespace is never changed: links are made inside
//! the hub (`ip -n hub link add … peer … netns X`), nft rules inside the
//! namespace they cut, and every connection the harness makes starts in a
//! thread that entered one of these namespaces first ([`enter`]).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// What every namespace of this harness is called by.
pub const PREFIX: &str = "hff-";

/// The private /24 (RFC 2544's benchmarking range, routed by no network):
/// `SUBNET.x`.
pub const SUBNET: &str = "198.18.77";

/// One namespace of a run: its name and its address.
#[derive(Debug, Clone)]
pub struct Host {
    /// The short role name (`e0`, `n1`, `relay`, `ctl`).
    pub role: String,
    /// The namespace's name (`hff-<tag>-<role>`).
    pub ns: String,
    /// Its address on the bridge.
    pub ip: String,
}

/// The namespaces of one run; removed on drop (with every rule and every
/// process still in them).
pub struct Net {
    hub: String,
    /// Every host, in creation order.
    pub hosts: Vec<Host>,
    removed: bool,
}

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args, None)
}

/// Runs `prog ARGS` (with `stdin` fed when given); its stderr on failure.
pub fn run(prog: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    use std::io::Write;
    let mut cmd = Command::new(prog);
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|e| format!("{prog}: {e}"))?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        w.write_all(text.as_bytes()).map_err(|e| format!("{prog} stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("{prog}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{prog} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The output of `prog ARGS` (empty on failure).
pub fn output(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Fails unless the root namespace has neither an address nor a route of
/// its own in [`SUBNET`] (the default route aside): the harness's addresses
/// must be reachable only from inside its namespaces.
pub fn assert_root_has_no_route() -> Result<(), String> {
    let addrs = output("ip", &["-o", "addr", "show"]);
    if let Some(l) = addrs.lines().find(|l| l.contains(&format!(" {SUBNET}."))) {
        return Err(format!("the root namespace has an address in {SUBNET}.0/24: {l}"));
    }
    let routes = output("ip", &["route", "show", "table", "all", "to", "match", &format!("{SUBNET}.1")]);
    if let Some(l) = routes.lines().find(|l| !l.starts_with("default") && !l.trim().is_empty()) {
        return Err(format!("the root namespace routes {SUBNET}.0/24 itself: {l}"));
    }
    Ok(())
}

impl Net {
    /// Makes the hub and one namespace per role in `roles`, with addresses
    /// `SUBNET.(first + i)` in order.
    pub fn create(tag: &str, roles: &[(&str, u8)]) -> Result<Net, String> {
        assert_root_has_no_route()?;
        let hub = format!("{PREFIX}{tag}-hub");
        let mut net = Net { hub: hub.clone(), hosts: Vec::new(), removed: false };
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for &(role, last) in roles {
            let ns = format!("{PREFIX}{tag}-{role}");
            let host = Host { role: role.to_string(), ns: ns.clone(), ip: format!("{SUBNET}.{last}") };
            ip(&["netns", "add", &ns])?;
            net.hosts.push(host.clone());
            let veth = format!("v{role}");
            ip(&["-n", &hub, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &hub, "link", "set", &veth, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", host.ip), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The host of `role`.
    pub fn host(&self, role: &str) -> &Host {
        self.hosts.iter().find(|h| h.role == role).unwrap_or_else(|| panic!("no host {role}"))
    }

    /// Kills every process still in a namespace of this run and removes the
    /// namespaces (rules and links go with them).
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        let mut names: Vec<String> = self.hosts.iter().map(|h| h.ns.clone()).collect();
        names.push(self.hub.clone());
        for ns in &names {
            kill_all_in(ns);
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}

/// SIGKILLs every process in namespace `ns` (`ip netns pids`: only processes
/// of a namespace this harness made).
pub fn kill_all_in(ns: &str) {
    for pid in output("ip", &["netns", "pids", ns]).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Removes every namespace named with [`PREFIX`] (and kills what runs in
/// them) and unmounts the scratch mounts under `/tmp/hff-*`: the leftovers
/// of runs that could not clean up (a SIGKILLed harness). Returns what it
/// removed.
pub fn cleanup_leftovers() -> Vec<String> {
    cleanup(PREFIX, "/tmp/hff-")
}

/// Removes the namespaces named `prefix…` (killing what runs in them) and
/// unmounts what is mounted under a path starting with `mounts`.
pub fn cleanup(prefix: &str, mounts: &str) -> Vec<String> {
    let mut removed = Vec::new();
    for line in output("ip", &["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        if name.starts_with(prefix) {
            kill_all_in(name);
            if ip(&["netns", "del", name]).is_ok() {
                removed.push(format!("namespace {name}"));
            }
        }
    }
    let table = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for m in table.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        if m.starts_with(mounts) && run("umount", &["-l", m], None).is_ok() {
            removed.push(format!("mount {m}"));
        }
    }
    removed
}

/// Moves the calling thread into namespace `ns` (threads it starts later
/// inherit it). Every connection the harness makes runs after this.
pub fn enter(ns: &str) -> Result<(), String> {
    let f = File::open(format!("/var/run/netns/{ns}")).map_err(|e| format!("open namespace {ns}: {e}"))?;
    // SAFETY: setns(2) on a namespace file descriptor we own; it changes only
    // this thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(format!("setns {ns}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `cmd` start in namespace `ns`, in a process group of its own (so
/// that a wrapper such as faketime or strace and the server stop and die
/// together).
pub fn spawn_in(cmd: &mut Command, ns: &str) -> Result<(), String> {
    let f = File::open(format!("/var/run/netns/{ns}")).map_err(|e| format!("open namespace {ns}: {e}"))?;
    let fd = f.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (setns, setpgid) on a descriptor that stays
    // open until exec (kept alive by `f`, moved into the closure).
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &f;
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 || libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The harness blocks the signals its signal thread waits for;
            // the child must not inherit that mask.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    Ok(())
}

/// nft rules inside one namespace: a table of the harness's own, removed
/// whole on heal (and with the namespace).
pub mod nft {
    use super::run;

    const TABLE: &str = "hff";

    /// Replaces the harness's rules in namespace `ns` by `rules` (nft
    /// statements of its input and output chains, `{in}`/`{out}` placeholders
    /// are not used: each rule names its direction).
    pub fn set(ns: &str, input: &[String], output: &[String]) -> Result<(), String> {
        let _ = clear(ns);
        let mut script =
            format!("table inet {TABLE} {{\n chain input {{ type filter hook input priority -10; policy accept;\n");
        for r in input {
            script.push_str(&format!("  {r}\n"));
        }
        script.push_str(" }\n chain output { type filter hook output priority -10; policy accept;\n");
        for r in output {
            script.push_str(&format!("  {r}\n"));
        }
        script.push_str(" }\n}\n");
        run("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&script))
    }

    /// Removes the harness's rules from `ns`.
    pub fn clear(ns: &str) -> Result<(), String> {
        run("ip", &["netns", "exec", ns, "nft", "delete", "table", "inet", TABLE], None)
    }

    /// Rules that drop everything to and from `peers` (both chains).
    pub fn cut(peers: &[String]) -> (Vec<String>, Vec<String>) {
        let set = peers.join(", ");
        (vec![format!("ip saddr {{ {set} }} drop")], vec![format!("ip daddr {{ {set} }} drop")])
    }

    /// Rules that drop `percent`% of the packets to and from `peers`, and
    /// answer `reset_percent`% of their TCP segments with a reset.
    pub fn flaky(peers: &[String], percent: u32, reset_percent: u32) -> (Vec<String>, Vec<String>) {
        let set = peers.join(", ");
        let mut input = vec![format!("ip saddr {{ {set} }} numgen random mod 100 < {percent} drop")];
        if reset_percent > 0 {
            input.push(format!(
                "ip saddr {{ {set} }} meta l4proto tcp numgen random mod 100 < {reset_percent} reject with tcp reset"
            ));
        }
        (input, vec![format!("ip daddr {{ {set} }} numgen random mod 100 < {percent} drop")])
    }
}

//! The hidden `--test-clock` these tests run on: its route exists only with
//! the flag, refuses a bad number, and accumulates time.

use super::RestartableServer;
use testkit::process::ServerProcess;
use testkit::request_bytes;

#[test]
fn the_advance_route_exists_only_with_the_flag() {
    let p = ServerProcess::serve(&["--workers", "1"]);
    let mut c = p.client();
    c.send(&request_bytes("POST", "/_test/advance/1000", &[], b""));
    let r = c.read_response().expect("an answer");
    assert_eq!(r.status, 404, "{r:?}");
}

#[test]
fn advances_accumulate_and_bad_numbers_are_refused() {
    let mut n = RestartableServer::memory(&["--reservation-ttl", "4"]);
    assert_eq!(n.advance(1500)["now_ms"], 1500);
    assert_eq!(n.advance(0)["now_ms"], 1500);
    assert_eq!(n.advance(2500)["now_ms"], 4000);
    for bad in ["-1", "x", "", "1.5"] {
        n.client.send(&request_bytes("POST", &format!("/_test/advance/{bad}"), &[], b""));
        let r = n.client.read_response().expect("an answer");
        assert_eq!(r.status, 400, "{bad:?}: {r:?}");
    }
    // A GET is not the route.
    n.client.send(&request_bytes("GET", "/_test/advance/10", &[], b""));
    assert_eq!(n.client.read_response().expect("an answer").status, 404);
}

//! The SGLang scenarios' steps (reserve, release, confirm + delete), on the
//! loadgen worker.

use super::{call, Rec, Shared, Stats, Worker};
use hf3fs_meta_client::sglang as scan;
use hf3fs_perf::sglang;

impl Worker {
    /// SGLang's reserve of `--batch` fresh keys into self.sg_got; false when
    /// the iteration cannot go on.
    pub(super) async fn sg_reserve(&mut self, sh: &Shared, st: &mut Stats, rec: Rec) -> bool {
        self.sg_keys.clear();
        for _ in 0..sh.args.batch {
            let k = sglang::random_key(&mut self.rng);
            self.sg_keys.push(k);
        }
        let body = sglang::reserve_body(&self.sg_keys);
        let path = sglang::path("reserve_and_allocate_page_indices");
        let Some((_, resp)) = call(&mut self.conn, sh, st, &path, &body, rec).await else {
            return false;
        };
        if scan::reserved_indices(resp, &mut self.sg_got).is_none() || self.sg_got.len() != self.sg_keys.len() {
            if sh.validate {
                st.violation(1, || "reserve answered a malformed list, or one of the wrong length".into());
            }
            self.sg_got.clear();
            self.sg_got.extend((0..self.sg_keys.len() as i64).map(|p| (false, p)));
        }
        st.alloc_failed += self.sg_got.iter().filter(|&&(_, p)| p < 0).count() as u64;
        true
    }

    /// Releases the pages of the last SGLang reserve (untimed).
    pub(super) async fn sg_release(&mut self, sh: &Shared, st: &mut Stats) {
        self.release.clear();
        self.release.extend(self.sg_got.iter().filter(|&&(w, p)| !w && p >= 0).map(|&(_, p)| p));
        if !self.release.is_empty() {
            let body = sglang::confirm_body([], &self.release);
            call(&mut self.conn, sh, st, &sglang::path("confirm_write"), &body, Rec::Aux).await;
        }
    }

    /// SGLang's set: reserve (untimed), confirm (timed), then delete the keys
    /// (untimed) so that a finite space never fills.
    pub(super) async fn sg_confirm(&mut self, sh: &Shared, st: &mut Stats) {
        if !self.sg_reserve(sh, st, Rec::Aux).await || self.sg_got.iter().all(|&(_, p)| p < 0) {
            return;
        }
        let written = self.sg_keys.iter().zip(self.sg_got.iter().map(|&(_, p)| p)).filter(|&(_, p)| p >= 0);
        let body = sglang::confirm_body(written, &[]);
        if let Some((status, _)) = call(&mut self.conn, sh, st, &sglang::path("confirm_write"), &body, Rec::Timed).await
        {
            if sh.validate && status != 204 {
                st.violation(1, || format!("confirm_write answered {status}, expected 204"));
            }
        }
        let body = sglang::keys_body(&self.sg_keys);
        call(&mut self.conn, sh, st, &sglang::path("delete_keys"), &body, Rec::Aux).await;
    }
}

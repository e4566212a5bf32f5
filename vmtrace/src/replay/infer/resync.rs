//! Resync after a placement miss: the kernel's address is applied to the model, whatever it
//! takes. The model first claims the address as it stands; when it cannot (the range is not
//! free or pooled there), each rule below is asked in turn whether the trace explains why, and
//! the claim is tried again after each that changed the model. The order runs from the
//! narrowest evidence to the broadest, so a broad rule never acts where a narrow one would
//! have:
//!
//! 1. a decay under way had already ended in the kernel (`start_at_work`: decay node by node);
//! 2. a pool hidden as empty is in use after all (`hidden`: hidden pools put back);
//! 3. a run of picks at the top of a merged hidden range is a pool (`hidden`: split);
//! 4. the kernel used space the model had hidden (`hidden`: hidden ranges read as a pool or
//!    free space);
//! 5. the kernel's last purge took this lazy area and left another the model took (`swaps`);
//! 6. the kernel had this range free while the model holds it pooled (`pooled_found_free`).
//!
//! What is left unclaimed stays outside the model (its free is then recognised).

use crate::model::{AllocRequest, Allocated, ModelError, Placement};
use crate::replay::Replayer;

impl Replayer<'_> {
    /// Claims the kernel's `addr` for `req` in the model, through the rules above.
    pub(in crate::replay) fn claim_observed(
        &mut self,
        req: &AllocRequest,
        node: u32,
        addr: u64,
        predicted: Option<&Allocated>,
    ) -> Result<Placement, ModelError> {
        let size = req.size;
        let mut claimed = self.model.claim(req, addr);
        if claimed.is_err() {
            if let Some(c) = self.end_decays_holding(req, addr) {
                claimed = c;
            }
        }
        if claimed.is_err() {
            self.restore_hidden_pool_in_use(size, addr);
        }
        if claimed.is_err() {
            self.split_merged_pool(req, node, addr);
        }
        if claimed.is_err() {
            if let Some(c) = self.unhide_used(req, node, addr, predicted) {
                claimed = c;
            }
        }
        if claimed.is_err() && self.swap_purged(addr, size) {
            // The kernel's last purge took this lazy area and left another the model took.
            self.rules.swapped += 1;
            claimed = self.model.claim(req, addr);
        }
        if claimed.is_err() && self.free_pooled_found_free(addr, size) {
            claimed = self.model.claim(req, addr);
        }
        claimed
    }
}

#[cfg(test)]
mod tests {
    use crate::model::Placement;
    use crate::replay::testkit::{pooled_areas, replayer, request, PAGE};
    use crate::replay::ReplayOptions;

    /// Hidden space the kernel used is given back and claimed; pooled entries under a free-tree
    /// placement are freed and the placement claimed; an address no rule explains (a busy
    /// area's) stays unclaimed.
    #[test]
    fn each_rule_is_asked_until_the_kernels_address_can_be_claimed() {
        let opts = ReplayOptions::default();
        let mut r = replayer(&opts);
        let addrs = pooled_areas(&mut r, 3, 1);
        let above = addrs[2] + 16 * PAGE;
        assert!(r.model.hide(above, 4 * PAGE, 0));
        let one = request(&r, 1, 0);
        assert!(matches!(
            r.claim_observed(&one, 0, above, None),
            Ok(Placement::FreeTree(_))
        ));
        assert_eq!((r.rules.unhidden, r.rules.pooled_found_free), (1, 0));
        assert!(r.model.hidden().is_empty());

        let two = request(&r, 2, 0);
        assert!(r.claim_observed(&two, 0, addrs[0], None).is_ok());
        assert_eq!((r.rules.unhidden, r.rules.pooled_found_free), (1, 1));
        assert_eq!(
            r.model.pools().len(0, PAGE),
            1,
            "only the two entries under it"
        );

        assert!(r.claim_observed(&one, 0, above, None).is_err(), "busy");
        r.model.check_invariants().unwrap();
    }
}

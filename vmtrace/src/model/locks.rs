//! Lock accounting for each vmap lock instance of mm/vmalloc.c (and `init_mm.page_table_lock`):
//! how many critical sections each one saw.
//!
//! Counts only; waiting times come from the timing simulation (`sim::des`).

/// Critical sections entered, per lock instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LockCounts {
    /// `free_vmap_area_lock` (global spinlock).
    pub free_vmap_area_lock: u64,
    /// `vmap_purge_lock` (global mutex).
    pub vmap_purge_lock: u64,
    /// `init_mm.page_table_lock`: one section per new page-table page.
    pub page_table_lock: u64,
    /// `vn->busy.lock`, per node (one entry in the `global` variant: `vmap_area_lock`).
    pub busy: Vec<u64>,
    /// `vn->lazy.lock`, per node (one entry in the `global` variant: `purge_vmap_area_lock`).
    pub lazy: Vec<u64>,
    /// `vn->pool_lock`, per node (empty in the `global` variant).
    pub pool: Vec<u64>,
}

impl LockCounts {
    pub fn new(nodes: usize, pools: bool) -> Self {
        Self {
            busy: vec![0; nodes],
            lazy: vec![0; nodes],
            pool: if pools { vec![0; nodes] } else { Vec::new() },
            ..Self::default()
        }
    }

    #[inline]
    pub(crate) fn bump(v: &mut [u64], i: u32) {
        if let Some(c) = v.get_mut(i as usize) {
            *c += 1;
        }
    }
}

/// A per-node lock class, for the log of sections [`super::Model::log_locks`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeLock {
    Busy,
    Lazy,
    Pool,
}

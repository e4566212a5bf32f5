//! vmap nodes: how addresses and CPUs map to nodes (`vmap_init_nodes`, `addr_to_node_id` and
//! `node_alloc`'s pool choice in mm/vmalloc.c).

/// The node layer's geometry: `nr_vmap_nodes` and `vmap_zone_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    nr_nodes: u32,
    zone_size: u64,
}

impl NodeLayout {
    /// `vmap_init_nodes` on 64-bit: `clamp(possible_cpus, 1, 128)` nodes of 16-page zones, or
    /// one node with a zone of 1 byte when there is a single CPU.
    pub fn from_cpus(possible_cpus: u32, page_size: u64) -> Self {
        let n = possible_cpus.clamp(1, 128);
        if n > 1 {
            Self::new(n, 16 * page_size)
        } else {
            Self::new(1, 1)
        }
    }

    /// An explicit layout (trace header or a what-if override); zero values are raised to 1 so
    /// that the arithmetic below can never divide by zero.
    pub fn new(nr_nodes: u32, zone_size: u64) -> Self {
        Self {
            nr_nodes: nr_nodes.max(1),
            zone_size: zone_size.max(1),
        }
    }

    pub fn nr_nodes(&self) -> u32 {
        self.nr_nodes
    }

    pub fn zone_size(&self) -> u64 {
        self.zone_size
    }

    /// `addr_to_node_id`: 64 KiB zones dealt round-robin to the nodes.
    #[inline]
    pub fn addr_to_node(&self, addr: u64) -> u32 {
        ((addr / self.zone_size) % u64::from(self.nr_nodes)) as u32
    }

    /// `node_alloc`'s pool choice: `raw_smp_processor_id() % nr_vmap_nodes`.
    #[inline]
    pub fn cpu_to_node(&self, cpu: u32) -> u32 {
        cpu % self.nr_nodes
    }

    /// How many busy locks `find_unlink_vmap_area` takes to find an area that starts at
    /// `va_start`: the walk starts at `addr_to_node(va_start)`, where the area always lives, so
    /// one. Kept as a function so that lookups by an inner address can be modelled later.
    #[inline]
    pub fn lookup_locks(&self, _va_start: u64) -> u32 {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_round_robin() {
        let l = NodeLayout::from_cpus(2, 4096);
        assert_eq!(l.zone_size(), 65536);
        assert_eq!(l.addr_to_node(0xffffc90000000000), 0);
        assert_eq!(l.addr_to_node(0xffffc90000010000), 1);
        assert_eq!(l.addr_to_node(0xffffc9000001f000), 1);
        assert_eq!(l.addr_to_node(0xffffc90000020000), 0);
        assert_eq!(l.cpu_to_node(3), 1);
        let one = NodeLayout::from_cpus(1, 4096);
        assert_eq!((one.nr_nodes(), one.zone_size()), (1, 1));
        assert_eq!(NodeLayout::from_cpus(500, 4096).nr_nodes(), 128);
    }
}

//! The kernel's own type information (`/sys/kernel/btf/vmlinux`), read by vmtrace itself.
//!
//! A raw tracepoint program sees the `TP_PROTO` arguments, each widened to u64, in prototype
//! order, not the tracefs record whose `format` file the other probes go by. Prototypes change
//! between kernel versions (arguments get added, reordered, renamed), so the order must be read
//! from the running kernel, never assumed; the kernel records it in BTF as
//! `typedef void (*btf_trace_<name>)(void *__data, <TP_PROTO args>)`. Likewise the offsets of
//! struct members that probes read (`vmap_node.nr_purged`, `work_struct.func`) depend on the
//! kernel's configuration and must come from BTF.
//!
//! That typedef gives the order but not the names: pahole encodes a function *pointer*'s
//! prototype from DWARF, which names no parameters. The names come from a real function with the
//! same prototype: `__probestub_<name>` (one per tracepoint, Linux 6.5+) or `__bpf_trace_<name>`
//! (one per event class, so only when the tracepoint is its own class). A candidate is used only
//! if its parameter types match the typedef's exactly, so a name can never shift position.
//!
//! aya parses BTF too, but `aya::Btf` keeps its type lookup crate-private, hence this small
//! reader. It answers only those two questions; everything else in the blob is only walked far
//! enough to find where each type starts. Malformed input is an error or a `None`, never a panic:
//! the blob comes from a file a user may point anywhere.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the running kernel exposes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
/// `struct btf_header` up to and including `str_len`; later kernels may append fields, which
/// `hdr_len` then covers.
const HEADER_LEN: usize = 24;
/// `struct btf_type`: name_off, info, size_or_type.
const TYPE_LEN: usize = 12;
/// Bounds the walk through modifier chains and nested anonymous members, so that a cycle in a
/// malformed blob ends instead of looping.
const MAX_DEPTH: usize = 8;
/// Bounds the total members visited by one `member_offset`: a malformed blob can nest anonymous
/// members that fan out exponentially within `MAX_DEPTH`.
const MAX_VISITS: usize = 1 << 20;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Why a BTF blob could not be read. Offsets are bytes from the start of the blob, so the
/// position can be found with a hex dump.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not BTF: magic is {found:#06x}, expected 0xeb9f")]
    BadMagic { found: u16 },
    #[error("BTF version {version} is not supported (this reader knows version 1)")]
    UnsupportedVersion { version: u8 },
    #[error("BTF header length {hdr_len} is shorter than the {HEADER_LEN}-byte header")]
    ShortHeader { hdr_len: u32 },
    #[error("BTF is truncated: {what} at byte offset {offset} runs past the end ({len} bytes)")]
    Truncated {
        what: String,
        offset: u64,
        len: usize,
    },
    #[error("BTF type {id} (at byte offset {offset}) has unknown kind {kind}")]
    UnknownKind { id: u32, kind: u32, offset: usize },
}

/// One `struct btf_type`, with the position of the kind-specific data after it.
#[derive(Clone, Copy, Debug)]
struct RawType {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    /// Byte offset of the data that follows the 12-byte header.
    extra: usize,
}

impl RawType {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }

    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }

    fn kind_flag(&self) -> bool {
        self.info >> 31 != 0
    }
}

/// The kernel's BTF, indexed for the lookups vmtrace needs.
#[derive(Clone, Debug)]
pub struct KernelBtf {
    data: Vec<u8>,
    /// Written in the other byte order than this machine's: every read swaps.
    swapped: bool,
    str_start: usize,
    str_end: usize,
    /// Byte offset of each type by id; index 0 (void) is unused.
    types: Vec<usize>,
    /// TYPEDEF ids by name: the `btf_trace_*` prototypes.
    typedefs: HashMap<String, Vec<u32>>,
    /// STRUCT ids by name: several structs may share a name (file-local structs that happen to
    /// be named alike survive deduplication as distinct types), so all are kept and searched in
    /// order.
    structs: HashMap<String, Vec<u32>>,
    /// FUNC ids by name, only for the functions that name tracepoint arguments
    /// ([`NAMING_FUNCS`]): vmlinux has ~56k functions, four times the other entries together.
    funcs: HashMap<String, Vec<u32>>,
}

/// Prefixes of the functions whose prototypes name a tracepoint's arguments, best first.
const NAMING_FUNCS: [&str; 2] = ["__probestub_", "__bpf_trace_"];

impl KernelBtf {
    /// Reads the running kernel's BTF ([`VMLINUX_BTF`]).
    pub fn read() -> Result<Self, BtfError> {
        Self::read_from(Path::new(VMLINUX_BTF))
    }

    pub fn read_from(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(data)
    }

    /// Parses raw BTF (as in `/sys/kernel/btf/vmlinux`, not an ELF `.BTF` section) in either
    /// byte order.
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let len = data.len();
        let truncated = |what: &str, offset: u64| BtfError::Truncated {
            what: what.into(),
            offset,
            len,
        };
        let magic_bytes: [u8; 2] = data
            .get(0..2)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| truncated("header", 0))?;
        let swapped = if u16::from_ne_bytes(magic_bytes) == MAGIC {
            false
        } else if u16::from_ne_bytes(magic_bytes).swap_bytes() == MAGIC {
            true
        } else {
            return Err(BtfError::BadMagic {
                found: u16::from_le_bytes(magic_bytes),
            });
        };
        if data.len() < HEADER_LEN {
            return Err(truncated("header", 0));
        }
        let mut btf = KernelBtf {
            data,
            swapped,
            str_start: 0,
            str_end: 0,
            types: vec![0],
            typedefs: HashMap::new(),
            structs: HashMap::new(),
            funcs: HashMap::new(),
        };
        let version = btf.data[2];
        if version != 1 {
            return Err(BtfError::UnsupportedVersion { version });
        }
        // The header was length-checked above; `u32_at` cannot fail for these fields.
        let field = |btf: &KernelBtf, off: usize| btf.u32_at(off).unwrap_or(0);
        let hdr_len = field(&btf, 4);
        let type_off = field(&btf, 8);
        let type_len = field(&btf, 12);
        let str_off = field(&btf, 16);
        let str_len = field(&btf, 20);
        if (hdr_len as usize) < HEADER_LEN {
            return Err(BtfError::ShortHeader { hdr_len });
        }
        if hdr_len as usize > len {
            return Err(truncated("header", 0));
        }
        // Offsets are relative to the end of the header; u64 sums of u32s cannot overflow.
        let section = |name: &str, off: u32, sec_len: u32| {
            let start = u64::from(hdr_len) + u64::from(off);
            let end = start + u64::from(sec_len);
            if end > len as u64 {
                Err(truncated(name, start))
            } else {
                Ok((start as usize, end as usize))
            }
        };
        let (type_start, type_end) = section("type section", type_off, type_len)?;
        (btf.str_start, btf.str_end) = section("string section", str_off, str_len)?;

        let mut typedefs: HashMap<String, Vec<u32>> = HashMap::new();
        let mut structs: HashMap<String, Vec<u32>> = HashMap::new();
        let mut funcs: HashMap<String, Vec<u32>> = HashMap::new();
        let mut pos = type_start;
        while pos < type_end {
            let id = u32::try_from(btf.types.len()).unwrap_or(u32::MAX);
            let what = |kind: Option<u32>| match kind {
                Some(kind) => format!("type {id} (kind {kind})"),
                None => format!("type {id}"),
            };
            let t = btf
                .type_at(pos)
                .filter(|t| t.extra <= type_end)
                .ok_or_else(|| truncated(&what(None), pos as u64))?;
            let kind = t.kind();
            let extra = extra_len(kind, t.vlen()).ok_or(BtfError::UnknownKind {
                id,
                kind,
                offset: pos,
            })?;
            let next = t
                .extra
                .checked_add(extra)
                .filter(|&next| next <= type_end)
                .ok_or_else(|| truncated(&what(Some(kind)), pos as u64))?;
            let index = match kind {
                KIND_TYPEDEF => Some(&mut typedefs),
                KIND_STRUCT => Some(&mut structs),
                KIND_FUNC => Some(&mut funcs),
                _ => None,
            };
            if let (Some(index), true) = (index, t.name_off != 0) {
                let name = btf
                    .str_at(t.name_off)
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .filter(|name| {
                        kind != KIND_FUNC || NAMING_FUNCS.iter().any(|p| name.starts_with(p))
                    });
                if let Some(name) = name {
                    match index.get_mut(name) {
                        Some(ids) => ids.push(id),
                        None => {
                            index.insert(name.to_owned(), vec![id]);
                        }
                    }
                }
            }
            btf.types.push(pos);
            pos = next;
        }
        btf.typedefs = typedefs;
        btf.structs = structs;
        btf.funcs = funcs;
        Ok(btf)
    }

    /// The names of a tracepoint's `TP_PROTO` arguments, in the order a raw tracepoint program
    /// receives them (the leading `__data` dropped). The count and order come from the
    /// `btf_trace_<tracepoint>` typedef, which is what the kernel checks raw tracepoint programs
    /// against; an argument no function names (see the module comment) is `""`. `None` if the
    /// kernel has no such typedef (no such tracepoint, or BTF built without it) or it is not a
    /// pointer to a function prototype.
    pub fn raw_tp_args(&self, tracepoint: &str) -> Option<Vec<String>> {
        let ids = self.typedefs.get(&format!("btf_trace_{tracepoint}"))?;
        let proto = ids.iter().find_map(|&id| self.trace_proto(id))?;
        let own = self.param_names(proto)?;
        if own.iter().all(|name| !name.is_empty()) {
            return Some(own);
        }
        let named = NAMING_FUNCS.iter().find_map(|prefix| {
            let ids = self.funcs.get(&format!("{prefix}{tracepoint}"))?;
            ids.iter().find_map(|&id| {
                let func = self.type_by_id(id)?;
                let other = self.type_by_id(func.size_or_type)?;
                if other.kind() != KIND_FUNC_PROTO || !self.same_param_types(proto, other) {
                    return None;
                }
                self.param_names(other)
                    .filter(|names| names.iter().all(|name| !name.is_empty()))
            })
        });
        Some(named.unwrap_or(own))
    }

    /// The byte offset of `member` in `struct struct_name`, looking through anonymous struct
    /// and union members, as the kernel often wraps members in them. The first struct of that
    /// name that has the member answers. `None` if none has it, or if it is a bitfield that does
    /// not start on a byte.
    pub fn member_offset(&self, struct_name: &str, member: &str) -> Option<u64> {
        let ids = self.structs.get(struct_name)?;
        let mut visits = 0;
        ids.iter()
            .find_map(|&id| self.member_bits(id, member.as_bytes(), 0, &mut visits))
            .and_then(|bits| (bits % 8 == 0).then_some(bits / 8))
    }

    /// The FUNC_PROTO a `btf_trace_*` typedef points to, if it has the `__data` parameter.
    fn trace_proto(&self, typedef: u32) -> Option<RawType> {
        let t = self.type_by_id(typedef)?;
        let ptr = self.skip_modifiers(t.size_or_type)?;
        if ptr.kind() != KIND_PTR {
            return None;
        }
        let proto = self.skip_modifiers(ptr.size_or_type)?;
        (proto.kind() == KIND_FUNC_PROTO && proto.vlen() > 0).then_some(proto)
    }

    /// A FUNC_PROTO's parameters as (name_off, type), `__data` included.
    fn params(&self, proto: RawType) -> impl Iterator<Item = Option<(u32, u32)>> + '_ {
        (0..proto.vlen()).map(move |i| {
            let at = proto.extra.checked_add(i.checked_mul(8)?)?;
            Some((self.u32_at(at)?, self.u32_at(at.checked_add(4)?)?))
        })
    }

    /// Parameter names after `__data`; unnamed ones are `""`.
    fn param_names(&self, proto: RawType) -> Option<Vec<String>> {
        self.params(proto)
            .skip(1)
            .map(|p| {
                let name = self.str_at(p?.0)?;
                Some(String::from_utf8_lossy(name).into_owned())
            })
            .collect()
    }

    /// Whether two prototypes take the same parameter types. BTF is deduplicated, so equal
    /// types have equal ids.
    fn same_param_types(&self, a: RawType, b: RawType) -> bool {
        a.vlen() == b.vlen()
            && self
                .params(a)
                .zip(self.params(b))
                .all(|(x, y)| matches!((x, y), (Some(x), Some(y)) if x.1 == y.1))
    }

    /// The bit offset of `member` within the struct or union `id`, descending into anonymous
    /// members.
    fn member_bits(&self, id: u32, member: &[u8], depth: usize, visits: &mut usize) -> Option<u64> {
        let t = self.type_by_id(id)?;
        if !matches!(t.kind(), KIND_STRUCT | KIND_UNION) || depth > MAX_DEPTH {
            return None;
        }
        for i in 0..t.vlen() {
            *visits += 1;
            if *visits > MAX_VISITS {
                return None;
            }
            let at = t.extra.checked_add(i.checked_mul(12)?)?;
            let name_off = self.u32_at(at)?;
            let ty = self.u32_at(at.checked_add(4)?)?;
            let raw_offset = self.u32_at(at.checked_add(8)?)?;
            // With kind_flag the high 8 bits hold the bitfield size.
            let bits = u64::from(if t.kind_flag() {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            });
            if name_off == 0 {
                let Some(inner) = self.skip_modifiers_id(ty) else {
                    continue;
                };
                if let Some(b) = self.member_bits(inner, member, depth + 1, visits) {
                    return bits.checked_add(b);
                }
            } else if self.str_at(name_off) == Some(member) {
                return Some(bits);
            }
        }
        None
    }

    /// The type `id` refers to once CONST, VOLATILE, RESTRICT, TYPEDEF and TYPE_TAG are peeled
    /// off.
    fn skip_modifiers(&self, id: u32) -> Option<RawType> {
        self.type_by_id(self.skip_modifiers_id(id)?)
    }

    fn skip_modifiers_id(&self, mut id: u32) -> Option<u32> {
        for _ in 0..=MAX_DEPTH * 4 {
            let t = self.type_by_id(id)?;
            match t.kind() {
                KIND_CONST | KIND_VOLATILE | KIND_RESTRICT | KIND_TYPEDEF | KIND_TYPE_TAG => {
                    id = t.size_or_type;
                }
                _ => return Some(id),
            }
        }
        None
    }

    fn type_by_id(&self, id: u32) -> Option<RawType> {
        if id == 0 {
            return None;
        }
        self.type_at(*self.types.get(id as usize)?)
    }

    fn type_at(&self, pos: usize) -> Option<RawType> {
        Some(RawType {
            name_off: self.u32_at(pos)?,
            info: self.u32_at(pos.checked_add(4)?)?,
            size_or_type: self.u32_at(pos.checked_add(8)?)?,
            extra: pos.checked_add(TYPE_LEN)?,
        })
    }

    fn u32_at(&self, pos: usize) -> Option<u32> {
        let bytes: [u8; 4] = self.data.get(pos..pos.checked_add(4)?)?.try_into().ok()?;
        let v = u32::from_ne_bytes(bytes);
        Some(if self.swapped { v.swap_bytes() } else { v })
    }

    /// The NUL-terminated string at `off` in the string section (without the NUL); an
    /// unterminated last string runs to the section's end.
    fn str_at(&self, off: u32) -> Option<&[u8]> {
        let start = self.str_start.checked_add(off as usize)?;
        if start >= self.str_end {
            return None;
        }
        let rest = self.data.get(start..self.str_end)?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        rest.get(..end)
    }
}

/// Bytes of kind-specific data after a `struct btf_type`; `None` for a kind this reader does not
/// know, whose size it therefore cannot skip.
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
        KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
        KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
        | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Assembles raw BTF: types get ids in the order they are pushed, starting at 1.
    struct Builder {
        strs: Vec<u8>,
        types: Vec<u8>,
        next_id: u32,
        big_endian: bool,
    }

    impl Builder {
        fn new() -> Self {
            Builder {
                strs: vec![0],
                types: Vec::new(),
                next_id: 1,
                big_endian: false,
            }
        }

        fn word(&self, v: u32) -> [u8; 4] {
            if self.big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }

        fn str(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strs.len() as u32;
            self.strs.extend_from_slice(s.as_bytes());
            self.strs.push(0);
            off
        }

        fn u32(&mut self, v: u32) {
            let w = self.word(v);
            self.types.extend_from_slice(&w);
        }

        fn ty(&mut self, name: &str, kind: u32, vlen: u32, kflag: bool, size_or_type: u32) -> u32 {
            let name_off = self.str(name);
            self.u32(name_off);
            self.u32(vlen | (kind << 24) | (u32::from(kflag) << 31));
            self.u32(size_or_type);
            self.next_id += 1;
            self.next_id - 1
        }

        fn int(&mut self, name: &str, size: u32) -> u32 {
            let id = self.ty(name, KIND_INT, 0, false, size);
            self.u32(size * 8);
            id
        }

        fn ptr(&mut self, target: u32) -> u32 {
            self.ty("", KIND_PTR, 0, false, target)
        }

        fn typedef(&mut self, name: &str, target: u32) -> u32 {
            self.ty(name, KIND_TYPEDEF, 0, false, target)
        }

        fn func_proto(&mut self, ret: u32, params: &[(&str, u32)]) -> u32 {
            let id = self.ty("", KIND_FUNC_PROTO, params.len() as u32, false, ret);
            for &(name, ty) in params {
                let off = self.str(name);
                self.u32(off);
                self.u32(ty);
            }
            id
        }

        /// `members` are (name, type, raw offset field).
        fn composite(
            &mut self,
            kind: u32,
            name: &str,
            size: u32,
            kflag: bool,
            members: &[(&str, u32, u32)],
        ) -> u32 {
            let id = self.ty(name, kind, members.len() as u32, kflag, size);
            for &(name, ty, off) in members {
                let name_off = self.str(name);
                self.u32(name_off);
                self.u32(ty);
                self.u32(off);
            }
            id
        }

        fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            let magic = if self.big_endian {
                MAGIC.to_be_bytes()
            } else {
                MAGIC.to_le_bytes()
            };
            out.extend_from_slice(&magic);
            out.push(1);
            out.push(0);
            let type_len = self.types.len() as u32;
            for v in [
                HEADER_LEN as u32,
                0,
                type_len,
                type_len,
                self.strs.len() as u32,
            ] {
                out.extend_from_slice(&self.word(v));
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strs);
            out
        }
    }

    /// A tracepoint prototype `btf_trace_tp(void *__data, struct s *ptr, unsigned long size,
    /// <unnamed> const int)`, named in full by its probe stub, and a struct `s` with a plain member, a member in an anonymous union, and
    /// a bitfield.
    fn sample(big_endian: bool) -> Vec<u8> {
        let mut b = Builder::new();
        b.big_endian = big_endian;
        let int = b.int("int", 4);
        let ulong = b.int("unsigned long", 8);
        let void_ptr = b.ptr(0);
        let cint = b.ty("", KIND_CONST, 0, false, int);
        let anon = b.composite(
            KIND_UNION,
            "",
            8,
            false,
            &[("inner_a", ulong, 0), ("inner_b", int, 0)],
        );
        let s = b.composite(
            KIND_STRUCT,
            "s",
            32,
            false,
            &[("first", int, 0), ("", anon, 64), ("last", ulong, 128)],
        );
        // kind_flag set: bitfield size in the high byte, bit offset in the low 24 bits.
        b.composite(
            KIND_STRUCT,
            "bits",
            8,
            true,
            &[
                ("whole", int, 32),
                ("flag", int, 3 | (1 << 24)),
                ("byte", int, 8 | (8 << 24)),
            ],
        );
        let sp = b.ptr(s);
        let proto = b.func_proto(
            0,
            &[
                ("__data", void_ptr),
                ("ptr", sp),
                ("size", ulong),
                ("", cint),
            ],
        );
        let proto_ptr = b.ptr(proto);
        let const_ptr = b.ty("", KIND_CONST, 0, false, proto_ptr);
        b.typedef("btf_trace_tp", const_ptr);
        let stub = b.func_proto(
            0,
            &[
                ("__data", void_ptr),
                ("ptr", sp),
                ("size", ulong),
                ("flags", cint),
            ],
        );
        b.ty("__probestub_tp", KIND_FUNC, 0, false, stub);
        // A typedef of the right name but the wrong shape: not a pointer.
        b.typedef("btf_trace_bad", proto);
        // A cycle through typedefs must end.
        let cyc = b.next_id;
        b.typedef("btf_trace_cycle", cyc + 1);
        b.typedef("loop", cyc);
        b.build()
    }

    #[test]
    fn raw_tp_args_follow_typedef_pointer_proto() {
        for big_endian in [false, true] {
            let btf = KernelBtf::parse(sample(big_endian)).unwrap();
            assert_eq!(
                btf.raw_tp_args("tp").unwrap(),
                vec!["ptr".to_string(), "size".into(), "flags".into()]
            );
            assert_eq!(btf.raw_tp_args("missing"), None);
            assert_eq!(btf.raw_tp_args("bad"), None);
            assert_eq!(btf.raw_tp_args("cycle"), None);
        }
    }

    /// pahole leaves the typedef's parameters unnamed; the names come from the functions.
    #[test]
    fn raw_tp_args_named_by_functions() {
        let mut b = Builder::new();
        let int = b.int("int", 4);
        let ulong = b.int("unsigned long", 8);
        let void_ptr = b.ptr(0);
        let tp = |b: &mut Builder, name: &str, types: &[u32]| {
            let params: Vec<(&str, u32)> = types.iter().map(|&t| ("", t)).collect();
            let proto = b.func_proto(0, &params);
            let ptr = b.ptr(proto);
            b.typedef(&format!("btf_trace_{name}"), ptr);
        };
        let func = |b: &mut Builder, name: &str, params: &[(&str, u32)]| {
            let proto = b.func_proto(0, params);
            b.ty(name, KIND_FUNC, 0, false, proto);
        };
        // Named by its probe stub, preferred over the class function.
        tp(&mut b, "stubbed", &[void_ptr, ulong, int]);
        func(
            &mut b,
            "__bpf_trace_stubbed",
            &[("__data", void_ptr), ("x", ulong), ("y", int)],
        );
        func(
            &mut b,
            "__probestub_stubbed",
            &[("__data", void_ptr), ("addr", ulong), ("n", int)],
        );
        // No stub (before Linux 6.5): its own event class names it.
        tp(&mut b, "classy", &[void_ptr, ulong]);
        func(
            &mut b,
            "__bpf_trace_classy",
            &[("__data", void_ptr), ("size", ulong)],
        );
        // A stub whose types differ must not lend its names.
        tp(&mut b, "mismatch", &[void_ptr, ulong, int]);
        func(
            &mut b,
            "__probestub_mismatch",
            &[("__data", void_ptr), ("a", int), ("b", ulong)],
        );
        func(
            &mut b,
            "__probestub_short",
            &[("__data", void_ptr), ("a", ulong)],
        );
        tp(&mut b, "short", &[void_ptr, ulong, int]);
        // Nothing names it.
        tp(&mut b, "anonymous", &[void_ptr, int]);
        let btf = KernelBtf::parse(b.build()).unwrap();
        assert_eq!(btf.raw_tp_args("stubbed").unwrap(), ["addr", "n"]);
        assert_eq!(btf.raw_tp_args("classy").unwrap(), ["size"]);
        assert_eq!(btf.raw_tp_args("mismatch").unwrap(), ["", ""]);
        assert_eq!(btf.raw_tp_args("short").unwrap(), ["", ""]);
        assert_eq!(btf.raw_tp_args("anonymous").unwrap(), [""]);
    }

    #[test]
    fn member_offsets() {
        let btf = KernelBtf::parse(sample(false)).unwrap();
        assert_eq!(btf.member_offset("s", "first"), Some(0));
        assert_eq!(btf.member_offset("s", "last"), Some(16));
        // Inside the anonymous union at byte 8.
        assert_eq!(btf.member_offset("s", "inner_a"), Some(8));
        assert_eq!(btf.member_offset("s", "inner_b"), Some(8));
        assert_eq!(btf.member_offset("s", "nope"), None);
        assert_eq!(btf.member_offset("nostruct", "first"), None);
        // kind_flag: the size byte must not leak into the offset.
        assert_eq!(btf.member_offset("bits", "whole"), Some(4));
        assert_eq!(btf.member_offset("bits", "byte"), Some(1));
        // A bitfield not on a byte boundary has no byte offset.
        assert_eq!(btf.member_offset("bits", "flag"), None);
    }

    #[test]
    fn later_struct_of_same_name_answers_when_first_lacks_member() {
        let mut b = Builder::new();
        let int = b.int("int", 4);
        b.composite(KIND_STRUCT, "dup", 4, false, &[("a", int, 0)]);
        b.composite(
            KIND_STRUCT,
            "dup",
            8,
            false,
            &[("a", int, 0), ("b", int, 32)],
        );
        let btf = KernelBtf::parse(b.build()).unwrap();
        assert_eq!(btf.member_offset("dup", "b"), Some(4));
    }

    #[test]
    fn self_containing_anonymous_member_ends() {
        let mut b = Builder::new();
        let own = b.next_id;
        b.composite(
            KIND_STRUCT,
            "selfish",
            8,
            false,
            &[("", own, 0), ("", own, 8)],
        );
        let btf = KernelBtf::parse(b.build()).unwrap();
        assert_eq!(btf.member_offset("selfish", "x"), None);
    }

    #[test]
    fn truncated_header() {
        let blob = sample(false);
        for len in [0, 1, 2, 10, HEADER_LEN - 1] {
            let err = KernelBtf::parse(blob[..len].to_vec()).unwrap_err();
            assert!(
                matches!(err, BtfError::Truncated { ref what, .. } if what == "header"),
                "{len}: {err}"
            );
        }
    }

    #[test]
    fn bad_magic_and_version() {
        let mut blob = sample(false);
        blob[0] = 0x12;
        let err = KernelBtf::parse(blob).unwrap_err();
        assert!(matches!(err, BtfError::BadMagic { found: 0xeb12 }), "{err}");
        let mut blob = sample(false);
        blob[2] = 2;
        let err = KernelBtf::parse(blob).unwrap_err();
        assert!(
            matches!(err, BtfError::UnsupportedVersion { version: 2 }),
            "{err}"
        );
    }

    #[test]
    fn sections_past_end() {
        let blob = sample(false);
        // Cut into the string section.
        let err = KernelBtf::parse(blob[..blob.len() - 1].to_vec()).unwrap_err();
        assert!(
            matches!(err, BtfError::Truncated { ref what, .. } if what == "string section"),
            "{err}"
        );
        // A type section longer than the blob.
        let mut long = blob.clone();
        long[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = KernelBtf::parse(long).unwrap_err();
        assert!(
            matches!(err, BtfError::Truncated { ref what, offset: 24, .. } if what == "type section"),
            "{err}"
        );
        // A type whose members run past the type section's end.
        let mut b = Builder::new();
        let int = b.int("int", 4);
        b.composite(KIND_STRUCT, "s", 4, false, &[("a", int, 0)]);
        let mut blob = b.build();
        let vlen_at = HEADER_LEN + 16 + 4;
        blob[vlen_at] = 2;
        let err = KernelBtf::parse(blob).unwrap_err();
        assert!(
            matches!(err, BtfError::Truncated { ref what, offset: 40, .. } if what == "type 2 (kind 4)"),
            "{err}"
        );
        assert!(err.to_string().contains("byte offset 40"), "{err}");
    }

    #[test]
    fn unknown_kind() {
        let mut b = Builder::new();
        b.int("int", 4);
        b.ty("odd", 25, 0, false, 0);
        let err = KernelBtf::parse(b.build()).unwrap_err();
        assert!(
            matches!(
                err,
                BtfError::UnknownKind {
                    id: 2,
                    kind: 25,
                    offset: 40
                }
            ),
            "{err}"
        );
    }

    fn exercise(btf: &KernelBtf) {
        for tp in ["tp", "bad", "cycle", ""] {
            let _ = btf.raw_tp_args(tp);
        }
        for (s, m) in [("s", "inner_a"), ("s", "last"), ("bits", "flag"), ("", "")] {
            let _ = btf.member_offset(s, m);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_do_not_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(btf) = KernelBtf::parse(data) {
                exercise(&btf);
            }
        }

        #[test]
        fn mutated_blob_does_not_panic(
            big_endian: bool,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in proptest::option::of(any::<usize>()),
        ) {
            let mut blob = sample(big_endian);
            for (at, byte) in edits {
                let at = at % blob.len();
                blob[at] = byte;
            }
            if let Some(cut) = cut {
                blob.truncate(cut % (blob.len() + 1));
            }
            if let Ok(btf) = KernelBtf::parse(blob) {
                exercise(&btf);
            }
        }
    }

    #[test]
    fn running_kernel() {
        let data = match std::fs::read(VMLINUX_BTF) {
            Ok(data) => data,
            Err(e) => {
                eprintln!("SKIPPED: no kernel BTF ({VMLINUX_BTF}: {e})");
                return;
            }
        };
        let size = data.len();
        let start = std::time::Instant::now();
        let btf = KernelBtf::parse(data).unwrap();
        eprintln!(
            "parsed {size} bytes, {} types in {:?} ({})",
            btf.types.len() - 1,
            start.elapsed(),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        let args = |tp: &str| {
            let args = btf.raw_tp_args(tp);
            eprintln!("raw_tp_args({tp}) = {args:?}");
            args
        };
        assert_eq!(
            args("alloc_vmap_area").unwrap(),
            ["addr", "size", "align", "vstart", "vend", "failed"]
        );
        assert_eq!(
            args("free_vmap_area_noflush").unwrap(),
            ["va_start", "nr_lazy", "nr_lazy_max"]
        );
        assert_eq!(
            args("purge_vmap_area_lazy").unwrap(),
            ["start", "end", "npurged"]
        );
        assert_eq!(args("contention_begin").unwrap(), ["lock", "flags"]);
        let page_alloc = args("mm_page_alloc").unwrap();
        assert_eq!(page_alloc[..3], ["page", "order", "gfp_flags"]);
        let offset = |s: &str, m: &str| {
            let off = btf.member_offset(s, m);
            eprintln!("member_offset({s}, {m}) = {off:?}");
            off
        };
        assert!(offset("work_struct", "func").is_some());
        assert!(offset("vmap_node", "nr_purged").is_some());

        // How many tracepoints get every argument named: a drop would mean the naming functions
        // moved.
        let tracepoints: Vec<&str> = btf
            .typedefs
            .keys()
            .filter_map(|name| name.strip_prefix("btf_trace_"))
            .collect();
        let unnamed: Vec<&str> = tracepoints
            .iter()
            .copied()
            .filter(|tp| {
                btf.raw_tp_args(tp)
                    .is_none_or(|args| args.iter().any(|a| a.is_empty()))
            })
            .collect();
        eprintln!(
            "{} of {} tracepoints have every argument named; not: {:?}",
            tracepoints.len() - unnamed.len(),
            tracepoints.len(),
            &unnamed[..unnamed.len().min(20)]
        );
    }
}

//! Kernel addresses as hex strings.
//!
//! Kernel addresses exceed 2^53, and many JSON readers (jq, JavaScript) silently round such
//! numbers, so the trace spells them `"0xffffc90000170000"`.

use std::fmt;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KAddr(pub u64);

impl fmt::Debug for KAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for KAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The lowest address of x86-64's kernel half with 5-level page tables (57-bit canonical).
/// Hashed `%pK` values are 32 bits wide and restricted ones are zero, so anything at or above
/// this is a real kernel address in either paging mode.
pub const KERNEL_HALF_5LEVEL: u64 = 0xff00_0000_0000_0000;
/// The lowest address of the kernel half with 4-level page tables (48-bit canonical). A
/// VMALLOC range below it can only come from a 5-level kernel (its base is 0xffa0… before
/// KASLR moves it down).
pub const KERNEL_HALF_4LEVEL: u64 = 0xffff_8000_0000_0000;

impl KAddr {
    /// Whether the address lies in the kernel half of either paging mode.
    pub fn is_kernel(self) -> bool {
        self.0 >= KERNEL_HALF_5LEVEL
    }

    /// Parses `0x…` (or bare hex) as the kernel prints it.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok().map(KAddr)
    }
}

impl Serialize for KAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 18];
        s.serialize_str(format_hex(self.0, &mut buf))
    }
}

/// Formats without allocating: the writer calls this for several fields of every event.
pub(crate) fn format_hex(v: u64, buf: &mut [u8; 18]) -> &str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let ndigits = (64 - v.leading_zeros() as usize).div_ceil(4);
    let ndigits = ndigits.max(1);
    buf[0] = b'0';
    buf[1] = b'x';
    for i in 0..ndigits {
        let shift = 4 * (ndigits - 1 - i);
        buf[2 + i] = DIGITS[((v >> shift) & 0xf) as usize];
    }
    // Only ASCII was written, so this cannot fail.
    std::str::from_utf8(&buf[..2 + ndigits]).unwrap_or("0x0")
}

impl<'de> Deserialize<'de> for KAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = KAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a kernel address as a \"0x…\" hex string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KAddr, E> {
                if !v.starts_with("0x") {
                    return Err(E::custom(format!("address `{v}` must start with 0x")));
                }
                KAddr::parse(v).ok_or_else(|| E::custom(format!("bad hex address `{v}`")))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hex_round_trip() {
        let a = KAddr(0xffffc90000170000);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"0xffffc90000170000\"");
        assert_eq!(serde_json::from_str::<KAddr>(&json).unwrap(), a);
        assert_eq!(serde_json::to_string(&KAddr(0)).unwrap(), "\"0x0\"");
        assert!(serde_json::from_str::<KAddr>("\"ffff\"").is_err());
        assert!(serde_json::from_str::<KAddr>("12").is_err());
    }

    proptest! {
        #[test]
        fn any_u64_round_trips(v: u64) {
            let json = serde_json::to_string(&KAddr(v)).unwrap();
            prop_assert_eq!(&json, &format!("\"{:#x}\"", v));
            prop_assert_eq!(serde_json::from_str::<KAddr>(&json).unwrap(), KAddr(v));
        }
    }
}

//! Sizes as the kernel and coreutils print them, both ways.
//!
//! Captures of /proc/allocinfo reach us raw (`%12lli`), through `numfmt --to=iec` (the kernel
//! documentation's own recipe), or from the 2024 pre-merge series that printed `string_get_size()`
//! output such as `27.2MiB`. The formatters here reproduce those programs exactly, so that a
//! generated snapshot can be printed the way a user would have captured it and parsed back.

/// A number read from a size or count column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number {
    /// The value, rounded to the nearest integer when the text had a fraction or a unit.
    pub value: i128,
    /// False when the text was a human size: the value is then only as good as its 2-3 digits.
    pub exact: bool,
}

/// Largest number of digits accepted. It keeps every intermediate product inside `u128`; real
/// sizes have at most 20 digits.
const MAX_DIGITS: usize = 30;

/// Reads `4096`, `-4096`, `2.8M`, `4.0Mi`, `27.2MiB`, `1.20 GiB` (the unit as its own token is
/// handled by the caller), `512B` or `97.7kB`.
///
/// Single letters and `Xi`/`XiB` are powers of 1024: that is what `numfmt --to=iec`, `--to=iec-i`
/// and the kernel's `STRING_UNITS_2` print. `kB`, `MB`, `GB`... are powers of 1000, as the kernel's
/// `STRING_UNITS_10` prints them. Returns `None` for anything else, including `1e6`, `inf` and
/// `0x10`, which no known producer writes.
pub fn parse_number(text: &str) -> Option<Number> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, rest) = rest.split_at(int_len);
    let (frac_part, unit) = match rest.strip_prefix('.') {
        Some(after) => {
            let n = after.bytes().take_while(u8::is_ascii_digit).count();
            if n == 0 {
                return None;
            }
            after.split_at(n)
        }
        None => ("", rest),
    };
    if int_part.is_empty() || int_part.len() + frac_part.len() > MAX_DIGITS {
        return None;
    }
    let multiplier = unit_multiplier(unit)?;
    let mut digits: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        digits = digits * 10 + u128::from(b - b'0');
    }
    let scale = 10u128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    // Round half away from zero, in integers, so 2^63-sized values keep every digit.
    let numerator = digits.checked_mul(multiplier)?;
    let magnitude = numerator.checked_add(scale / 2)? / scale;
    let magnitude = i128::try_from(magnitude).ok()?;
    Some(Number {
        value: if negative { -magnitude } else { magnitude },
        exact: frac_part.is_empty() && (unit.is_empty() || unit == "B"),
    })
}

/// The multiplier of a unit suffix, or `None` when it is not one we know.
pub fn unit_multiplier(unit: &str) -> Option<u128> {
    const PREFIXES: &[u8] = b"KMGTPEZYRQ";
    match unit {
        "" | "B" => return Some(1),
        "kB" => return Some(1000),
        _ => {}
    }
    let mut chars = unit.chars();
    let letter = chars.next()?;
    let power = PREFIXES.iter().position(|&p| char::from(p) == letter)? + 1;
    let base: u128 = match chars.as_str() {
        "" | "i" | "iB" => 1024,
        "B" => 1000,
        _ => return None,
    };
    base.checked_pow(u32::try_from(power).ok()?)
}

/// Whether a whole token is a unit, as in the spaced form `27.2 MiB` that `string_get_size()`
/// printed before the series added its no-space flag.
pub fn is_unit_token(token: &str) -> bool {
    !token.is_empty()
        && !token.starts_with(|c: char| c.is_ascii_digit())
        && unit_multiplier(token).is_some()
}

/// Formats like `numfmt --to=iec` (round away from zero, one decimal below 10, `K M G T P E`).
///
/// Used for every size vmtrace prints, so its output can be compared with, and piped like, the
/// kernel documentation's `sort -g /proc/allocinfo | numfmt --to=iec`.
pub fn format_iec(value: i128) -> String {
    format_numfmt(value, "")
}

/// Formats like `numfmt --to=iec-i` (`Ki`, `Mi`, ...).
pub fn format_iec_i(value: i128) -> String {
    format_numfmt(value, "i")
}

fn format_numfmt(value: i128, suffix_tail: &str) -> String {
    const LETTERS: &[u8] = b"KMGTPEZYRQ";
    let sign = if value < 0 { "-" } else { "" };
    let magnitude = value.unsigned_abs();
    if magnitude < 1024 {
        return format!("{value}");
    }
    let mut power = 0u32;
    let mut unit = 1u128;
    while magnitude / unit >= 1024 {
        unit *= 1024;
        power += 1;
    }
    // Below 10 units numfmt keeps one decimal: work in tenths, rounding away from zero.
    let text = if magnitude / unit < 10 {
        let tenths = (magnitude * 10).div_ceil(unit);
        if tenths >= 100 {
            "10".to_string()
        } else {
            format!("{}.{}", tenths / 10, tenths % 10)
        }
    } else {
        let whole = magnitude.div_ceil(unit);
        if whole >= 1024 {
            // 1023.5K rounds to 1024K, which numfmt shows as the next unit.
            power += 1;
            "1.0".to_string()
        } else {
            whole.to_string()
        }
    };
    let letter = LETTERS
        .get(power as usize - 1)
        .map(|&b| char::from(b))
        .unwrap_or('?');
    format!("{sign}{text}{letter}{suffix_tail}")
}

/// Formats like the kernel's `string_get_size(size, 1, STRING_UNITS_2 | STRING_UNITS_NO_SPACE)`,
/// which the 2024 pre-merge allocinfo series printed: three significant figures, `KiB`, `MiB`...
/// (so 5 bytes print as `5.00B` and 1023.9 KiB as `1024KiB`, as the kernel does).
pub fn format_string_get_size(size: u64) -> String {
    const UNITS: [&str; 9] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"];
    const ROUNDING: [u32; 3] = [500, 50, 5];
    let mut size = size;
    let mut i = 0usize;
    let mut remainder: u32 = 0;
    let mut tmp = String::new();
    if size != 0 {
        // Napier's reduction, as the kernel does it: first bring the value under 2^32.
        while size >> 32 != 0 {
            size /= 1024;
            i += 1;
        }
        while size >= 1024 {
            remainder = (size % 1024) as u32;
            size /= 1024;
            i += 1;
        }
        let mut sf_cap = size as u32;
        let mut j = 0usize;
        while sf_cap * 10 < 1000 {
            sf_cap *= 10;
            j += 1;
        }
        remainder = (remainder * 1000) >> 10;
        remainder += ROUNDING[j.min(2)];
        if remainder >= 1000 {
            remainder -= 1000;
            size += 1;
        }
        if j > 0 {
            let digits = format!("{remainder:03}");
            tmp = format!(".{}", &digits[..j.min(3)]);
        }
    }
    let unit = UNITS.get(i).copied().unwrap_or("UNK");
    format!("{size}{tmp}{unit}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> Option<i128> {
        parse_number(text).map(|n| n.value)
    }

    #[test]
    fn raw_numbers_are_exact() {
        assert_eq!(
            parse_number("127664128"),
            Some(Number {
                value: 127664128,
                exact: true
            })
        );
        assert_eq!(n("-4096"), Some(-4096));
        assert_eq!(n("9223372036854775807"), Some(i64::MAX as i128));
        assert_eq!(n("-9223372036854775808"), Some(i64::MIN as i128));
        assert_eq!(n("+12"), Some(12));
        assert!(parse_number("512B").is_some_and(|n| n.exact));
    }

    #[test]
    fn human_numbers() {
        assert_eq!(n("2.8M"), Some(2936013));
        assert_eq!(n("4.0M"), Some(4194304));
        assert_eq!(n("1.0K"), Some(1024));
        assert_eq!(n("27M"), Some(28311552));
        assert_eq!(n("2.8Mi"), Some(2936013));
        assert_eq!(n("27.2MiB"), Some(28521267));
        assert_eq!(n("1.20GiB"), Some(1288490189));
        assert_eq!(n("3.11MiB"), Some(3261071));
        assert_eq!(n("5.00B"), Some(5));
        assert_eq!(n("97.7kB"), Some(97700));
        assert_eq!(n("1.5MB"), Some(1500000));
        assert_eq!(n("-1.1K"), Some(-1126));
        assert_eq!(n("8.0E"), Some(9223372036854775808));
        assert!(parse_number("2.8M").is_some_and(|n| !n.exact));
    }

    #[test]
    fn rejects_what_no_producer_writes() {
        for bad in [
            "", "-", "+", ".5", "5.", "1e6", "inf", "NaN", "0x10", "12k", "1.2.3", "1,5", "M",
            "12Kb", "12 ", " 12", "--1", "1MiBB",
        ] {
            assert_eq!(parse_number(bad), None, "{bad:?}");
        }
        // Too many digits to be a size: refused, not overflowed.
        assert_eq!(parse_number(&"9".repeat(31)), None);
        assert_eq!(parse_number(&format!("{}Q", "9".repeat(30))), None);
    }

    #[test]
    fn unit_tokens() {
        assert!(is_unit_token("MiB"));
        assert!(is_unit_token("B"));
        assert!(!is_unit_token("6970"));
        assert!(!is_unit_token("func:x"));
        assert!(!is_unit_token(""));
    }

    /// Expected strings come from GNU coreutils 9 `numfmt --to=iec` on this machine.
    #[test]
    fn iec_matches_numfmt() {
        let table: &[(i128, &str)] = &[
            (0, "0"),
            (1, "1"),
            (1023, "1023"),
            (1024, "1.0K"),
            (1025, "1.1K"),
            (1100, "1.1K"),
            (10239, "10K"),
            (10240, "10K"),
            (10241, "11K"),
            (1047552, "1023K"),
            (1048063, "1.0M"),
            (1048575, "1.0M"),
            (1048576, "1.0M"),
            (2936012, "2.8M"),
            (-1, "-1"),
            (-1025, "-1.1K"),
            (-2936012, "-2.8M"),
            (1099511627776, "1.0T"),
            (1124000000000, "1.1T"),
            (i64::MAX as i128, "8.0E"),
            (i64::MIN as i128, "-8.0E"),
        ];
        for &(value, text) in table {
            assert_eq!(format_iec(value), text, "{value}");
        }
        assert_eq!(format_iec_i(2936012), "2.8Mi");
        assert_eq!(format_iec_i(1023), "1023");
    }

    /// Expected strings follow lib/string_helpers.c by hand, and the LKML examples.
    #[test]
    fn string_get_size_matches_kernel() {
        assert_eq!(format_string_get_size(0), "0B");
        assert_eq!(format_string_get_size(5), "5.00B");
        assert_eq!(format_string_get_size(50), "50.0B");
        assert_eq!(format_string_get_size(512), "512B");
        assert_eq!(format_string_get_size(1024), "1.00KiB");
        assert_eq!(format_string_get_size(28521267), "27.2MiB");
        assert_eq!(format_string_get_size(1288490189), "1.20GiB");
        assert_eq!(format_string_get_size(3261071), "3.11MiB");
        assert_eq!(format_string_get_size(1048575), "1024KiB");
        assert_eq!(format_string_get_size(u64::MAX), "16.0EiB");
    }
}

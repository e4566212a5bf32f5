//! Value parsers shared by several subcommands' arguments. A leaf module: it imports nothing
//! from the rest of the crate, so any subcommand can use it without a cycle.

use std::time::Duration;

/// Parses durations such as `10s`, `500ms` or `1m30s`; a bare number means seconds, as in perf.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!(
            "`{s}` is not a valid duration: expected a non-negative number"
        ));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a valid duration ({e}); try `10s`, `500ms` or `1m30s`"))
}

/// Splits a `NAME=N` override (`--cost`, `--infer`) into its trimmed name and whole number;
/// `None` without an `=` or with anything but a number after it.
pub fn name_and_number(s: &str) -> Option<(&str, u64)> {
    let (name, value) = s.split_once('=')?;
    Some((name.trim(), value.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn name_and_number_splits_an_override() {
        assert_eq!(name_and_number(" join_span = 64 "), Some(("join_span", 64)));
        assert_eq!(name_and_number("join_span"), None);
        assert_eq!(name_and_number("join_span=x"), None);
        assert_eq!(name_and_number("join_span=-1"), None);
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("ten").unwrap_err().contains("`ten`"));
        assert!(parse_duration("-1").is_err());
    }
}

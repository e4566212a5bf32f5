//! Prints tags in each text form the kernel (and the usual shell pipelines) produced.
//!
//! This is the parser's mirror: tests print generated snapshots in every form and parse them back,
//! and users can turn a capture of one generation into another (`show` is for reading; this is for
//! feeding tools that expect the kernel's own layout).

use super::model::{Tag, Version};
use super::size::{format_iec, format_string_get_size};

/// The second header line, unchanged since v1.0.
pub const COLUMNS_HEADER: &str = "#     <size>  <calls> <tag info>";

/// A text form of /proc/allocinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TextFormat {
    /// 2024 pre-merge series: `27.2MiB     6970 mm/memory.c:1122 module:memory func:folio_prealloc`.
    PreMerge,
    /// Version 1.0 (Linux 6.10-6.17): header, raw bytes, `[module]`, trailing space.
    V1,
    /// Version 2.0 (Linux 6.18+): as 1.0 plus `key:value` pairs such as `accurate:no`.
    V2,
    /// `sort -g /proc/allocinfo | tail`: raw lines, no header, ascending bytes.
    SortG,
    /// `... | numfmt --to=iec`: sizes like `2.8M`, no header, input order.
    Numfmt,
    /// `numfmt --to=iec | sort -h`: human sizes, no header, ascending.
    SortH,
}

impl TextFormat {
    pub const ALL: [TextFormat; 6] = [
        TextFormat::PreMerge,
        TextFormat::V1,
        TextFormat::V2,
        TextFormat::SortG,
        TextFormat::Numfmt,
        TextFormat::SortH,
    ];

    /// Whether this form keeps bytes exactly (the others round them to 2-3 digits).
    pub fn is_exact(self) -> bool {
        matches!(self, TextFormat::V1 | TextFormat::V2 | TextFormat::SortG)
    }

    /// Whether this form can carry `accurate:no` and other `key:value` pairs.
    pub fn has_markers(self) -> bool {
        !matches!(self, TextFormat::PreMerge | TextFormat::V1)
    }
}

/// Prints `tags` in `format`. Information a format cannot hold is dropped: markers before v2.0,
/// exact sizes in the human forms, negative sizes in the pre-merge form (printed as 0, since
/// `string_get_size()` took an unsigned value).
pub fn to_text(tags: &[Tag], format: TextFormat) -> String {
    let mut sorted: Vec<&Tag> = tags.iter().collect();
    if matches!(format, TextFormat::SortG | TextFormat::SortH) {
        sorted.sort_by_key(|t| t.bytes);
    }
    let mut out = String::new();
    let header = match format {
        TextFormat::V1 => Some(Version::V1_0),
        TextFormat::V2 => Some(Version::V2_0),
        _ => None,
    };
    if let Some(version) = header {
        out.push_str(&format!(
            "allocinfo - version: {version}\n{COLUMNS_HEADER}\n"
        ));
    }
    for tag in sorted {
        let location = format!("{}:{}", tag.key.file, tag.key.line);
        match format {
            TextFormat::PreMerge => {
                let size = format_string_get_size(u64::try_from(tag.bytes).unwrap_or(0));
                out.push_str(&format!("{size:>8} {:8} {location}", tag.calls));
                if let Some(module) = &tag.key.module {
                    out.push_str(&format!(" module:{module}"));
                }
                out.push_str(&format!(" func:{}\n", tag.key.function));
            }
            _ => {
                let size = if format.is_exact() {
                    tag.bytes.to_string()
                } else {
                    format_iec(i128::from(tag.bytes))
                };
                out.push_str(&format!("{size:>12} {:8} {location}", tag.calls));
                if let Some(module) = &tag.key.module {
                    out.push_str(&format!(" [{module}]"));
                }
                out.push_str(&format!(" func:{}", tag.key.function));
                if format.has_markers() {
                    for (key, value) in &tag.extra {
                        out.push_str(&format!(" {key}:{value}"));
                    }
                    if !tag.accurate {
                        out.push_str(" accurate:no");
                    }
                }
                out.push_str(" \n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocinfo::model::TagKey;
    use std::collections::BTreeMap;

    fn tags() -> Vec<Tag> {
        vec![
            Tag {
                key: TagKey {
                    file: "drivers/staging/ctagmod/ctagmod.c".into(),
                    line: 20,
                    module: Some("ctagmod".into()),
                    function: "ctagmod_start".into(),
                },
                bytes: 4136960,
                calls: 1010,
                accurate: true,
                extra: BTreeMap::new(),
            },
            Tag {
                key: TagKey {
                    file: "arch/x86/kernel/cpu/mce/core.c".into(),
                    line: 2709,
                    module: None,
                    function: "mce_device_create".into(),
                },
                bytes: 49152,
                calls: 48,
                accurate: false,
                extra: BTreeMap::new(),
            },
        ]
    }

    #[test]
    fn kernel_layouts() {
        assert_eq!(
            to_text(&tags(), TextFormat::V2),
            "allocinfo - version: 2.0\n\
             #     <size>  <calls> <tag info>\n     \
             4136960     1010 drivers/staging/ctagmod/ctagmod.c:20 [ctagmod] func:ctagmod_start \n       \
             49152       48 arch/x86/kernel/cpu/mce/core.c:2709 func:mce_device_create accurate:no \n"
        );
        assert_eq!(
            to_text(&tags(), TextFormat::SortH),
            "         48K       48 arch/x86/kernel/cpu/mce/core.c:2709 func:mce_device_create accurate:no \n        \
             4.0M     1010 drivers/staging/ctagmod/ctagmod.c:20 [ctagmod] func:ctagmod_start \n"
        );
        assert_eq!(
            to_text(&tags()[..1], TextFormat::PreMerge),
            " 3.95MiB     1010 drivers/staging/ctagmod/ctagmod.c:20 module:ctagmod func:ctagmod_start\n"
        );
    }
}

//! Tracepoint `format` files: where each field of a tracepoint record lives on this kernel.
//!
//! The probes never hard-code an offset; they get them from here at load time, because the
//! record layout depends on the kernel build (common fields, padding, field types).

use std::path::{Path, PathBuf};

use super::{read_to_string, HostError};

/// Where tracefs is mounted, mounting it at `/sys/kernel/tracing` if we are allowed to.
pub fn locate() -> Result<PathBuf, HostError> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(PathBuf::from(dir));
        }
    }
    mount_tracefs()?;
    let dir = PathBuf::from("/sys/kernel/tracing");
    if dir.join("events").is_dir() {
        log::info!("mounted tracefs at {}", dir.display());
        Ok(dir)
    } else {
        Err(HostError::NoTracefs {
            reason: "mount succeeded but events/ is missing".into(),
        })
    }
}

fn mount_tracefs() -> Result<(), HostError> {
    let target = c"/sys/kernel/tracing";
    // SAFETY: all pointers are valid NUL-terminated strings; a null data pointer is allowed.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(HostError::NoTracefs {
            reason: std::io::Error::last_os_error().to_string(),
        })
    }
}

pub use crate::trace::wire::Field;

/// A parsed `events/<category>/<name>/format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    pub id: u32,
    /// Fields after the `common_*` header, in record order.
    pub fields: Vec<Field>,
}

impl Format {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// Reads and parses the format file of `category:name`.
pub fn read_format(tracefs: &Path, category: &str, name: &str) -> Result<Format, HostError> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    if !path.exists() {
        return Err(HostError::MissingTracepoint {
            category: category.into(),
            name: name.into(),
            path,
        });
    }
    let text = read_to_string(&path)?;
    parse_format(&text).map_err(|(line, message)| HostError::Parse {
        path,
        line,
        message,
    })
}

/// Parses format-file text; errors carry the 1-based line number.
pub fn parse_format(text: &str) -> Result<Format, (usize, String)> {
    let mut name = None;
    let mut id = None;
    let mut fields = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = line.trim();
        if let Some(v) = line.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("ID:") {
            id = Some(
                v.trim()
                    .parse()
                    .map_err(|_| (lineno, format!("bad ID `{}`", v.trim())))?,
            );
        } else if line.starts_with("field:") {
            let field = parse_field_line(line).map_err(|m| (lineno, m))?;
            if !field.name.starts_with("common_") {
                fields.push(field);
            }
        }
    }
    Ok(Format {
        name: name.ok_or((0, "no `name:` line".to_string()))?,
        id: id.ok_or((0, "no `ID:` line".to_string()))?,
        fields,
    })
}

/// `field:unsigned long addr; offset:8; size:8; signed:0;` (tab separated)
fn parse_field_line(line: &str) -> Result<Field, String> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = None;
    for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once(':')
            .ok_or_else(|| format!("expected key:value, found `{part}`"))?;
        let num = || {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("bad {key} `{value}`"))
        };
        match key.trim() {
            "field" => decl = Some(value.trim().to_string()),
            "offset" => offset = Some(num()?),
            "size" => size = Some(num()?),
            "signed" => signed = Some(num()? != 0),
            _ => {}
        }
    }
    let decl = decl.ok_or("missing field declaration")?;
    // The name is the last identifier of the declaration, before any array suffix.
    let name = decl
        .split(|c: char| c.is_whitespace() || c == '*')
        .rfind(|s| !s.is_empty())
        .map(|s| s.split('[').next().unwrap_or(s).to_string())
        .ok_or_else(|| format!("cannot find a name in `{decl}`"))?;
    let offset = offset.ok_or("missing offset")?;
    let size = size.ok_or("missing size")?;
    Ok(Field {
        name,
        offset: u16::try_from(offset).map_err(|_| format!("offset {offset} too large"))?,
        size: u8::try_from(size).map_err(|_| format!("size {size} too large"))?,
        decl,
        signed: signed.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOC: &str = "name: alloc_vmap_area
ID: 716
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned long addr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:unsigned long size;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long align;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long vstart;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long vend;\toffset:40;\tsize:8;\tsigned:0;
\tfield:int failed;\toffset:48;\tsize:4;\tsigned:1;

print fmt: \"va_start: %lu size=%lu\", REC->addr, REC->size
";

    #[test]
    fn parses_the_6_18_alloc_format() {
        let f = parse_format(ALLOC).unwrap();
        assert_eq!(f.name, "alloc_vmap_area");
        assert_eq!(f.id, 716);
        let names: Vec<_> = f.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["addr", "size", "align", "vstart", "vend", "failed"]);
        let failed = f.field("failed").unwrap();
        assert_eq!((failed.offset, failed.size, failed.signed), (48, 4, true));
        assert_eq!(f.field("vend").unwrap().offset, 40);
    }

    #[test]
    fn array_and_pointer_names() {
        let f = parse_field_line("field:char comm[16];\toffset:8;\tsize:16;\tsigned:0;").unwrap();
        assert_eq!((f.name.as_str(), f.size), ("comm", 16));
        let f = parse_field_line("field:void * ptr;\toffset:8;\tsize:8;\tsigned:0;").unwrap();
        assert_eq!(f.name, "ptr");
    }

    #[test]
    fn bad_offset_names_the_line() {
        let text = ALLOC.replace("offset:16;", "offset:x;");
        let (line, msg) = parse_format(&text).unwrap_err();
        assert_eq!(line, 10);
        assert!(msg.contains("offset"), "{msg}");
    }
}

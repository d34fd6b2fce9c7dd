//! Writing and reading files safely: every file the crate (and the `syncmem` command) writes
//! goes through [`write_atomic`], and readers of untrusted files bound what they hold in memory
//! ([`read_line_bounded`]).
//!
//! # Writing
//!
//! [`write_atomic`] writes a temporary file next to the target, then renames it over the
//! target, so a failed write leaves an existing file as it was and a reader never sees half a
//! file. Renaming over a path replaces whatever the path names, so the target is checked first
//! ([`check_target`]):
//!
//! - a symbolic link is followed (to any depth): its target is written, the link stays;
//! - a directory, a device node (`/dev/null`), a FIFO or a socket is refused with
//!   [`Error::Io`] saying what it is: renaming would replace it (as root, `/dev/null` would
//!   become a regular file), and writing into it in place would not be atomic;
//! - a new file gets the permissions a plain create gives (the umask's); a file that is
//!   replaced keeps its permissions (and, on Unix, its owner and group when the process may
//!   set them).
//!
//! The check and the rename are separate steps: a path changed between them by another
//! process is not detected.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::{Error, Result};

/// Symbolic links followed before giving up (as Linux's `ELOOP` limit).
const MAX_LINKS: usize = 40;

/// Numbers the temporary files of this process.
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

fn io_error(op: &'static str, path: &Path, error: io::Error) -> Error {
    Error::Io {
        op,
        path: path.to_path_buf(),
        error,
    }
}

/// What a file type is, when it is not a regular file.
fn not_regular(ft: fs::FileType) -> Option<&'static str> {
    if ft.is_file() {
        return None;
    }
    if ft.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return Some("a character device");
        }
        if ft.is_block_device() {
            return Some("a block device");
        }
        if ft.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// The file a write to `path` replaces: `path` with its symbolic links followed, and its
/// metadata when it exists.
fn resolve(path: &Path) -> Result<(PathBuf, Option<fs::Metadata>)> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&p).map_err(|e| io_error("read the link", &p, e))?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(m) => {
                if let Some(kind) = not_regular(m.file_type()) {
                    let shown = if p == path {
                        String::new()
                    } else {
                        format!(" ({} through a symbolic link)", p.display())
                    };
                    return Err(io_error(
                        "write",
                        path,
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "it is {kind}{shown}, not a regular file: files are written \
                                 to a temporary file renamed over the target, which would \
                                 replace it"
                            ),
                        ),
                    ));
                }
                return Ok((p, Some(m)));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((p, None)),
            Err(e) => return Err(io_error("inspect", path, e)),
        }
    }
    Err(io_error(
        "write",
        path,
        io::Error::other(format!("more than {MAX_LINKS} symbolic links to follow")),
    ))
}

/// The directory a file `p` lives in (`.` for a bare name).
fn dir_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Checks that [`write_atomic`] can write `path`, without writing anything: symbolic links are
/// followed, and the file they lead to must be a regular file or not exist yet, in a directory
/// that exists. Returns the file that would be written. Commands call it before long work, so
/// that a bad path fails at once.
///
/// # Errors
/// [`Error::Io`] naming `path`: it is a directory, a device, a FIFO or a socket; its directory
/// does not exist or is not a directory; a link cannot be read or the links loop.
pub fn check_target(path: &Path) -> Result<PathBuf> {
    let (target, meta) = resolve(path)?;
    if meta.is_none() {
        let dir = dir_of(&target);
        let refusal = |kind: io::ErrorKind, why: String| {
            Err(io_error("create", path, io::Error::new(kind, why)))
        };
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return refusal(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a directory", dir.display()),
                )
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return refusal(
                    e.kind(),
                    format!("the directory {} does not exist", dir.display()),
                )
            }
            Err(e) => return refusal(e.kind(), format!("the directory {}: {e}", dir.display())),
        }
    }
    Ok(target)
}

/// A temporary file next to `target`, created new (never an existing file).
fn create_temp(target: &Path, path: &Path) -> Result<(PathBuf, File)> {
    let dir = dir_of(target);
    let name = target
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    loop {
        let n = NEXT_TEMP.fetch_add(1, Relaxed);
        let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(f) => return Ok((temp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("create a temporary file for", path, e)),
        }
    }
}

/// Gives the temporary file the permissions (and on Unix the owner) of the file it replaces.
fn copy_attributes(file: &File, old: &fs::Metadata) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // Best effort: only a privileged process may give a file to another user.
        let _ = std::os::unix::fs::fchown(file, Some(old.uid()), Some(old.gid()));
    }
    file.set_permissions(old.permissions())
}

/// Writes the file `path` atomically: `write` fills a buffered temporary file in the same
/// directory, which is flushed to disk and renamed over `path`. See the [module docs](self)
/// for what `path` may be (symbolic links are followed; directories, devices, FIFOs and
/// sockets are refused).
///
/// On any error the temporary file is removed and an existing file at `path` is unchanged.
///
/// ```
/// # fn main() -> syncmem::Result<()> {
/// let path = std::env::temp_dir().join(format!("syncmem-doc-atomic-{}.txt", std::process::id()));
/// syncmem::file::write_atomic(&path, |w| w.write_all(b"one\n"))?;
/// assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
/// // Writing /dev/null would replace it: refused.
/// # #[cfg(unix)]
/// assert!(syncmem::file::write_atomic("/dev/null".as_ref(), |w| w.write_all(b"x")).is_err());
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Error::Io`] naming `path`: the errors of [`check_target`], and any error creating,
/// writing, flushing or renaming the temporary file (including the error `write` returns).
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let target = check_target(path)?;
    let old = fs::metadata(&target).ok().filter(fs::Metadata::is_file);
    let (temp, file) = create_temp(&target, path)?;
    let result = (|| -> Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write(&mut out).map_err(|e| io_error("write", path, e))?;
        let file = out
            .into_inner()
            .map_err(|e| io_error("write", path, e.into_error()))?;
        if let Some(old) = &old {
            copy_attributes(&file, old).map_err(|e| io_error("set the permissions of", path, e))?;
        }
        file.sync_all().map_err(|e| io_error("flush", path, e))?;
        drop(file);
        fs::rename(&temp, &target).map_err(|e| io_error("replace", path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Reads one line of at most `max` bytes into `buf` (cleared first), without its `\n` (and a
/// `\r` before it). Returns `Ok(false)` at the end of the input. A line longer than `max`
/// stops the read with an [`io::ErrorKind::InvalidData`] error before more than `max + 1`
/// bytes are held, so a file without line breaks (`/dev/zero`) cannot exhaust memory.
///
/// # Errors
/// The reader's errors; [`io::ErrorKind::InvalidData`] for a line over `max` bytes.
pub fn read_line_bounded(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<bool> {
    buf.clear();
    let mut any = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a line is longer than {max} bytes"),
            ));
        }
        buf.extend_from_slice(&chunk[..take]);
        input.consume(take + usize::from(done));
        if done {
            break;
        }
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded() {
        let mut input = io::Cursor::new(b"ab\r\ncde\n\nxy".to_vec());
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        while read_line_bounded(&mut input, &mut buf, 5).unwrap() {
            lines.push(String::from_utf8(buf.clone()).unwrap());
        }
        assert_eq!(lines, ["ab", "cde", "", "xy"]);
        let mut long = io::Cursor::new(b"long-line".to_vec());
        let e = read_line_bounded(&mut long, &mut buf, 5).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // An endless input without line breaks stops at the bound.
        let mut zeros = io::BufReader::new(io::repeat(0));
        let e = read_line_bounded(&mut zeros, &mut buf, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("longer than 1048576 bytes"), "{e}");
        assert!(buf.len() <= 1 << 20);
    }
}

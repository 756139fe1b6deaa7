//! Reading files that someone else may have put in place: cache entries,
//! the cache key and fusion dumps.
//!
//! A plain `fs::read` follows a symbolic link to `/dev/zero` and reads until
//! memory runs out, and blocks forever opening a FIFO that has no writer.
//! [`read_regular`] opens without following a final symbolic link and
//! without blocking, accepts only a regular file (checked on the open
//! descriptor, so the file cannot be swapped between the check and the
//! read), and stops reading one byte past its limit.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// Why [`read_regular`] read nothing.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Nothing at that path.
    Missing,
    /// A symbolic link, which is never followed.
    Symlink,
    /// Something other than a regular file: the kind, in words.
    NotRegular(&'static str),
    /// More than the limit, in bytes.
    TooLarge {
        limit: u64,
    },
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => f.write_str("no such file"),
            ReadError::Symlink => f.write_str("a symbolic link (links are not followed)"),
            ReadError::NotRegular(kind) => write!(f, "{kind}, not a regular file"),
            ReadError::TooLarge { limit } => write!(f, "larger than the limit of {limit} bytes"),
            ReadError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// The kind of a file that is not a regular one, for messages.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        return "a directory";
    }
    if file_type.is_symlink() {
        return "a symbolic link";
    }
    "a special file"
}

/// Opens `path` for reading without following a final symbolic link and
/// without blocking on a FIFO.
fn open_nofollow(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    }
    options.open(path)
}

/// The whole of `path` when it is a regular file of at most `max_bytes`,
/// with the open file (to refresh its time or check its owner).
pub(crate) fn read_regular(path: &Path, max_bytes: u64) -> Result<(File, Vec<u8>), ReadError> {
    let file = open_nofollow(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            return ReadError::Missing;
        }
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ELOOP) {
            return ReadError::Symlink;
        }
        ReadError::Io(e)
    })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular(kind_of(meta.file_type())));
    }
    if meta.len() > max_bytes {
        return Err(ReadError::TooLarge { limit: max_bytes });
    }
    // The length can grow after the fstat (a writer appending), so the read
    // itself is bounded too.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&file).take(max_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(ReadError::TooLarge { limit: max_bytes });
    }
    Ok((file, bytes))
}

/// The effective user id of this process (files it creates belong to it).
#[cfg(unix)]
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("deferfuse-fs-guard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn regular_files_read_and_everything_else_is_refused() {
        let dir = temp_dir("kinds");
        let file = dir.join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap().1, b"12345");
        assert!(matches!(read_regular(&file, 4), Err(ReadError::TooLarge { limit: 4 })));
        assert!(matches!(read_regular(&dir.join("none"), 5), Err(ReadError::Missing)));
        assert!(matches!(read_regular(&dir, 5), Err(ReadError::NotRegular("a directory"))));
        #[cfg(unix)]
        {
            let link = dir.join("zero");
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            assert!(matches!(read_regular(&link, 1 << 20), Err(ReadError::Symlink)));
            assert!(matches!(
                read_regular(Path::new("/dev/zero"), 1 << 20),
                Err(ReadError::NotRegular("a character device"))
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

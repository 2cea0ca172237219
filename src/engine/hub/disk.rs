//! Free space on the disk a download will land on, checked before any byte is fetched.

use std::path::Path;

/// Bytes an unprivileged process may still write on the file system holding `path` (or its nearest existing
/// ancestor); `None` where the platform does not say.
pub fn available_bytes(path: &Path) -> Option<u64> {
    let mut probe = path;
    while !probe.exists() {
        probe = probe.parent()?;
    }
    statvfs_available(probe)
}

#[cfg(unix)]
fn statvfs_available(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stat a properly sized, writable struct.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    (rc == 0).then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(not(unix))]
fn statvfs_available(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_real_folder_has_some_space() {
        let dir = tempfile::tempdir().unwrap();
        assert!(super::available_bytes(&dir.path().join("not/yet/made")).unwrap() > 0);
    }
}

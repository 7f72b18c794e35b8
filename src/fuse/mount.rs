//! Making a FUSE mount and getting its `/dev/fuse` descriptor, without
//! libfuse: mount(2) directly as root; as another user, `fusermount3`
//! (setuid root) mounts and hands the descriptor back over a socket
//! (the `_FUSE_COMMFD` protocol libfuse uses).
//!
//! Invariant: the descriptor returned is the session's only link to the
//! mount: closing every clone of it (the daemon exiting, even by kill -9)
//! aborts the connection, and I/O on the mount then fails with ENOTCONN
//! instead of hanging.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;

/// Mounts a FUSE filesystem named `source` (type `fuse.ramd`) at `mp`.
/// `allow_root` lets root reach a mount made by another user (needs
/// `user_allow_other` in /etc/fuse.conf).
pub fn mount(mp: &Path, source: &str, as_root: bool, allow_root: bool) -> io::Result<OwnedFd> {
    if as_root {
        mount_as_root(mp, source)
    } else {
        mount_with_fusermount(mp, source, allow_root)
    }
}

fn mount_as_root(mp: &Path, source: &str) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        std::fs::metadata(mp)?.mode() & libc::S_IFMT,
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    let data = CString::new(data).map_err(io::Error::other)?;
    use rustix::mount::MountFlags;
    rustix::mount::mount(
        source,
        mp,
        "fuse.ramd",
        MountFlags::NODEV | MountFlags::NOSUID | MountFlags::NOEXEC,
        data.as_c_str(),
    )?;
    Ok(dev)
}

fn mount_with_fusermount(mp: &Path, source: &str, allow_root: bool) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let their_fd = theirs.as_raw_fd();
    let mut opts = format!("nodev,nosuid,noexec,fsname={source},subtype=ramd");
    if allow_root {
        opts.push_str(",allow_root");
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-o")
        .arg(opts)
        .arg("--")
        .arg(mp)
        .env("_FUSE_COMMFD", their_fd.to_string());
    // SAFETY: the closure runs in the child between fork and exec and
    // calls only fcntl, which is async-signal-safe; it clears close-on-exec
    // on the socket end fusermount3 is told about.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    let out = cmd.output()?;
    drop(theirs);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!("fusermount3: {}", err.trim())));
    }
    receive_fd(&ours)
}

/// Receives one descriptor sent with SCM_RIGHTS.
fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, aligned as cmsg needs.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` points at live buffers (`iov` -> `byte`, `control`)
    // of the sizes it states, for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: recvmsg filled `msg`; CMSG_FIRSTHDR only reads its control
    // fields and returns null or a pointer inside `control`.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null cmsg points inside `control`, whose header the
    // kernel wrote; checked for SCM_RIGHTS with room for one int.
    unsafe {
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
            || ((*cmsg).cmsg_len as usize) < libc::CMSG_LEN(4) as usize
        {
            return Err(io::Error::other(
                "fusermount3 mounted but sent no /dev/fuse descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int);
        // SAFETY: the kernel installed `fd` in our table for us alone.
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

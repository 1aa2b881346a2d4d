//! The probe file system against the real kernel: served over /dev/fuse,
//! then over a queue per CPU, it must give every byte of its file back and
//! (over the queues) answer the reads there, not over /dev/fuse. Needs
//! root (mount(2)); over io_uring, a kernel that has it (6.14+).

use parcache_fuse_uring::probe::{self, Probe, Transport};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Reads `n` pieces of `len` bytes at spread offsets on every CPU (a
/// thread bound to each in turn), checking each byte.
fn read_everywhere(p: &Probe, n: u64, len: usize) {
    let cpus = parcache_fuse_uring::possible_cpus().unwrap();
    std::thread::scope(|s| {
        for cpu in 0..cpus {
            s.spawn(move || {
                let mut set = rustix::thread::CpuSet::new();
                set.set(cpu);
                let _ = rustix::thread::sched_setaffinity(None, &set);
                let f = std::fs::File::open(p.file()).unwrap();
                let mut buf = vec![0u8; len];
                for i in 0..n {
                    let at = (i * 7919 * 4096 + cpu as u64 * 4096) % (probe::FILE_SIZE - len as u64);
                    f.read_exact_at(&mut buf, at).unwrap();
                    for (k, &b) in buf.iter().enumerate() {
                        assert_eq!(
                            b,
                            probe::byte_at(at + k as u64),
                            "byte {} of the probe file",
                            at + k as u64
                        );
                    }
                }
                assert_eq!(std::fs::metadata(p.file()).unwrap().len(), probe::FILE_SIZE);
            });
        }
    });
}

#[test]
fn the_probe_serves_its_file_over_dev_fuse_and_over_the_queues() {
    if !is_root() {
        eprintln!("skipped: mounting the probe needs root");
        return;
    }
    let base = std::env::temp_dir().join(format!("parcache-probe-{}", std::process::id()));
    let (dev_at, ring_at) = (base.join("dev"), base.join("ring"));
    std::fs::create_dir_all(&dev_at).unwrap();
    std::fs::create_dir_all(&ring_at).unwrap();

    let p = Probe::mount(&dev_at, Transport::Dev).unwrap();
    assert!(!p.uring);
    read_everywhere(&p, 50, 4096);
    read_everywhere(&p, 4, 1 << 20);
    assert!(p.over_dev.load(Ordering::Relaxed) >= 2 * 54);
    assert_eq!(p.over_uring.load(Ordering::Relaxed), 0);
    p.stop().unwrap();

    let Some(_uring) = parcache_fuse_uring::UringEnabled::set().unwrap() else {
        eprintln!("over io_uring skipped: this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)");
        std::fs::remove_dir_all(&base).unwrap();
        return;
    };
    let p = Probe::mount(&ring_at, Transport::Uring).unwrap();
    assert!(
        p.uring,
        "the kernel offers io_uring (enable_uring is Y) and the probe asked for it"
    );
    let before = p.over_dev.load(Ordering::Relaxed);
    read_everywhere(&p, 50, 4096);
    read_everywhere(&p, 4, 1 << 20);
    let cpus = parcache_fuse_uring::possible_cpus().unwrap() as u64;
    assert!(
        p.over_uring.load(Ordering::Relaxed) >= cpus * 54,
        "{} requests over the queues for {} reads",
        p.over_uring.load(Ordering::Relaxed),
        cpus * 54
    );
    // Only forgets and interrupts (never answered) may still use /dev/fuse.
    assert_eq!(
        p.over_dev.load(Ordering::Relaxed),
        before,
        "answers over /dev/fuse once the queues are up"
    );
    // Unmounting ends every queue's thread without an error.
    p.stop().unwrap();

    // Answers sent from threads that end at once: the next request in
    // each entry must still come (it waited for ever when such a thread
    // had submitted the commit itself).
    let else_at = base.join("elsewhere");
    std::fs::create_dir_all(&else_at).unwrap();
    let p = Probe::mount(&else_at, Transport::UringAnsweredElsewhere).unwrap();
    let file = p.file();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&file).unwrap();
        let mut b = vec![0u8; 4096];
        for i in 0..12u64 {
            // Idle between requests: each entry waits for its next one
            // after the thread that answered its last has ended.
            std::thread::sleep(std::time::Duration::from_millis(30));
            f.read_exact_at(&mut b, i * 4096).unwrap();
            tx.send(b[0] == probe::byte_at(i * 4096)).unwrap();
        }
    });
    for i in 0..12 {
        let right = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("read {i} was never answered"));
        assert!(right, "read {i}: wrong bytes");
    }
    p.stop().unwrap();
    std::fs::remove_dir_all(&base).unwrap();
}

//! The NVMe/TCP target from the host side, in-process: a small client
//! speaks the protocol (ICReq, Fabrics Connect, Identify, Read/Write over
//! in-capsule data, R2T/H2CData and C2HData, digests) to a target bound on
//! port 0, and malformed PDUs get a C2HTermReq while other hosts go on
//! being served. The guest tests (tests/guest_nvme.rs) run the kernel's
//! initiator against the daemon.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use ramd::block::backend::Backend;
use ramd::block::{Export, ExportTable};
use ramd::nbd::access::{AccessRules, AccessTable};
use ramd::nvme::log::{lid, LogRequest};
use ramd::nvme::names::{self, DISCOVERY_NQN};
use ramd::nvme::pdu::{self, Digests, Pdu, CH_LEN};
use ramd::nvme::sqe::{
    admin, fctype, io, prop, Connect, ConnectData, Cqe, DataPtr, Property, Rw, Sqe, Status,
};
use ramd::nvme::{NvmeServer, NvmeShutdown, Target, TargetConfig};
use ramd::store::{MemoryBudget, RamStore};

const NODE: &str = "test-node";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const MIB: u64 = 1 << 20;

struct Setup {
    addr: SocketAddr,
    exports: Arc<ExportTable>,
    access: Arc<AccessTable>,
    target: Arc<Target>,
    stop: NvmeShutdown,
    run: Option<thread::JoinHandle<std::io::Result<()>>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(r) = self.run.take() {
            r.join().unwrap().unwrap();
        }
    }
}

fn store(size: u64) -> Arc<dyn Backend> {
    Arc::new(RamStore::new(size, None, Arc::new(MemoryBudget::new(u64::MAX))).unwrap())
}

fn setup(tweak: impl FnOnce(&mut TargetConfig)) -> Setup {
    let exports = Arc::new(ExportTable::new());
    exports.insert(Arc::new(Export::new("ram0", "", store(16 * MIB), false)));
    exports.insert(Arc::new(Export::new("ro", "", store(MIB), true)));
    let access = Arc::new(AccessTable::new());
    let mut config = TargetConfig::new(vec!["127.0.0.1:0".parse().unwrap()], NODE);
    tweak(&mut config);
    let target = Arc::new(Target::new(config, exports.clone(), access.clone()));
    let server = NvmeServer::bind(target.clone()).unwrap();
    let addr = server.local_addrs()[0];
    let stop = server.shutdown_handle();
    let run = Some(thread::spawn(move || server.run()));
    Setup {
        addr,
        exports,
        access,
        target,
        stop,
        run,
    }
}

/// A minimal NVMe/TCP host: one queue per client.
struct Client {
    s: TcpStream,
    d: Digests,
    /// The controller's MAXH2CDATA.
    max_h2c: usize,
    next_cid: u16,
    out: Vec<u8>,
    /// H2CData PDUs of this many bytes instead of the default split.
    h2c_piece: Option<usize>,
    /// R2Ts received so far.
    r2ts: usize,
}

/// What a command got back: its data (C2H) and its completion.
struct Done {
    data: Vec<u8>,
    cqe: Cqe,
}

impl Client {
    fn open(addr: SocketAddr, d: Digests) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut c = Client {
            s,
            d,
            max_h2c: 0,
            next_cid: 1,
            out: Vec::new(),
            h2c_piece: None,
            r2ts: 0,
        };
        let req = Pdu::ICReq(pdu::ICReq {
            pfv: 0,
            hpda: 0,
            digests: d,
            maxr2t: 0,
        });
        pdu::encode(&req, &[], Digests::default(), 0, &mut c.out);
        c.s.write_all(&c.out).unwrap();
        match c.recv().0 {
            Pdu::ICResp(r) => {
                assert_eq!(r.digests, d);
                assert_eq!(r.cpda, 0);
                assert!(r.maxh2cdata >= 4096 && r.maxh2cdata % 4 == 0);
                c.max_h2c = r.maxh2cdata as usize;
            }
            p => panic!("expected ICResp, got {p:?}"),
        }
        c
    }

    /// Reads one PDU: its header and data (digests checked).
    fn recv(&mut self) -> (Pdu, Vec<u8>) {
        let mut ch = [0u8; CH_LEN];
        self.s.read_exact(&mut ch).unwrap();
        let h = pdu::decode_common(&ch).unwrap();
        let d = if matches!(h.pdu_type, pdu::PduType::ICResp) {
            Digests::default()
        } else {
            self.d
        };
        let f = pdu::frame(&h, d, 1 << 24).unwrap();
        let mut rest = vec![0u8; f.total() - CH_LEN];
        self.s.read_exact(&mut rest).unwrap();
        let mut all = ch.to_vec();
        all.extend_from_slice(&rest);
        let p = pdu::decode(&h, &all[..f.header_len], &f).unwrap();
        let at = f.header_len + f.pad;
        let data = all[at..at + f.data_len].to_vec();
        if f.data_digest {
            pdu::check_data_digest(&data, all[at + f.data_len..][..4].try_into().unwrap()).unwrap();
        }
        (p, data)
    }

    fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    fn send(&mut self, pdu: &Pdu, data: &[u8]) {
        pdu::encode(pdu, data, self.d, 0, &mut self.out);
        self.s.write_all(&self.out).unwrap();
    }

    /// Sends a command with `inline` data in the capsule and serves R2Ts
    /// from `r2t_data`; collects C2H data until the completion.
    fn command(&mut self, sqe: Sqe, inline: &[u8], r2t_data: &[u8]) -> Done {
        self.send(&Pdu::CapsuleCmd(sqe.0), inline);
        let mut data = Vec::new();
        loop {
            match self.recv() {
                (Pdu::CapsuleResp(c), _) => {
                    let cqe = Cqe::decode(&c);
                    assert_eq!(cqe.cid, sqe.cid());
                    return Done { data, cqe };
                }
                (Pdu::C2HData(h), d) => {
                    assert_eq!(h.command_id, sqe.cid());
                    assert_eq!(h.offset as usize, data.len());
                    data.extend_from_slice(&d);
                }
                (Pdu::R2T(r), _) => {
                    let (o, l) = (r.offset as usize, r.length as usize);
                    // H2CData PDUs of at most MAXH2CDATA, and at least two
                    // per R2T when it is long enough, to cover offsets.
                    self.r2ts += 1;
                    let piece = self
                        .h2c_piece
                        .unwrap_or(self.max_h2c.min(l.div_ceil(2)).max(512));
                    let mut off = o;
                    while off < o + l {
                        let len = piece.min(o + l - off);
                        let h = Pdu::H2CData(pdu::DataHdr {
                            command_id: r.command_id,
                            ttag: r.ttag,
                            offset: off as u32,
                            length: len as u32,
                            last: off + len == o + l,
                            success: false,
                        });
                        self.send(&h, &r2t_data[off..off + len]);
                        off += len;
                    }
                }
                (p, _) => panic!("unexpected {p:?}"),
            }
        }
    }

    fn connect(&mut self, subnqn: &str, qid: u16, cntlid: u16) -> Cqe {
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize: 127,
            cattr: 0,
            kato_ms: if qid == 0 { 30_000 } else { 0 },
        };
        let cid = self.cid();
        let data = ConnectData {
            hostid: [1; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: HOST.into(),
        }
        .encode();
        self.command(c.encode(cid), &data, &[]).cqe
    }

    fn prop_get(&mut self, offset: u32, eight: bool) -> u64 {
        let cid = self.cid();
        let p = Property {
            eight_bytes: eight,
            offset,
            value: 0,
        };
        let d = self.command(p.encode(fctype::PROPERTY_GET, cid), &[], &[]);
        assert!(d.cqe.status.is_success(), "{:?}", d.cqe.status);
        d.cqe.result
    }

    fn enable(&mut self) {
        let cid = self.cid();
        let p = Property {
            eight_bytes: false,
            offset: prop::CC,
            value: 1 | (6 << 16) | (4 << 20),
        };
        let d = self.command(p.encode(fctype::PROPERTY_SET, cid), &[], &[]);
        assert!(d.cqe.status.is_success());
        assert_eq!(self.prop_get(prop::CSTS, false) & 1, 1);
    }

    fn identify(&mut self, cns: u8, nsid: u32) -> Done {
        let cid = self.cid();
        let mut s = Sqe::new(admin::IDENTIFY, cid, nsid);
        s.set_cdw(10, u32::from(cns))
            .set_data_ptr(DataPtr::Transport { len: 4096 });
        self.command(s, &[], &[])
    }

    /// Get Log Page `lid`, its first 4 KiB.
    fn log_page(&mut self, lid: u8) -> Done {
        let cid = self.cid();
        let mut log = LogRequest {
            lid,
            rae: false,
            len: 4096,
            offset: 0,
        }
        .encode(cid);
        log.set_data_ptr(DataPtr::Transport { len: 4096 });
        self.command(log, &[], &[])
    }

    fn rw(&mut self, opcode: u8, slba: u64, nlb: u32) -> Sqe {
        let cid = self.cid();
        let mut s = Rw {
            slba,
            nlb,
            fua: false,
            deallocate: false,
        }
        .encode(opcode, cid, 1);
        if opcode != io::WRITE_ZEROES {
            s.set_data_ptr(DataPtr::Transport { len: nlb * 512 });
        }
        s
    }

    fn read(&mut self, slba: u64, nlb: u32) -> Done {
        let s = self.rw(io::READ, slba, nlb);
        self.command(s, &[], &[])
    }

    /// A write: in the capsule when small, else through R2T.
    fn write(&mut self, slba: u64, data: &[u8], inline: bool) -> Cqe {
        let mut s = self.rw(io::WRITE, slba, (data.len() / 512) as u32);
        if inline {
            s.set_data_ptr(DataPtr::InCapsule {
                offset: 0,
                len: data.len() as u32,
            });
            self.command(s, data, &[]).cqe
        } else {
            self.command(s, &[], data).cqe
        }
    }
}

/// An admin queue and one I/O queue on drive `drive`.
fn controller(addr: SocketAddr, drive: &str, d: Digests) -> (Client, Client, u16) {
    let nqn = names::subsystem_nqn(NODE, drive);
    let mut a = Client::open(addr, d);
    let c = a.connect(&nqn, 0, 0xFFFF);
    assert!(c.status.is_success(), "{:?}", c.status);
    let cntlid = c.result as u16;
    a.enable();
    let mut q = Client::open(addr, d);
    let c = q.connect(&nqn, 1, cntlid);
    assert!(c.status.is_success(), "{:?}", c.status);
    (a, q, cntlid)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn identify_and_properties_describe_the_drive() {
    let s = setup(|_| {});
    let (mut a, _q, cntlid) = controller(s.addr, "ram0", Digests::default());
    let cap = a.prop_get(prop::CAP, true);
    assert_eq!(cap & 0xFFFF, 1023, "MQES: queues of 1024 entries");
    assert_ne!(cap & (1 << 37), 0, "NVM command set");
    assert_eq!(a.prop_get(prop::VS, false), 0x0001_0300);
    let id = a.identify(1, 0);
    assert!(id.cqe.status.is_success());
    assert_eq!(id.data.len(), 4096);
    assert_eq!(u16::from_le_bytes([id.data[78], id.data[79]]), cntlid);
    assert_eq!(id.data[111], 1, "an I/O controller");
    let nqn = names::subsystem_nqn(NODE, "ram0");
    assert_eq!(&id.data[768..768 + nqn.len()], nqn.as_bytes());
    assert!(
        u16::from_le_bytes([id.data[514], id.data[515]]) >= 128,
        "MAXCMD"
    );
    let ns = a.identify(0, 1);
    assert_eq!(
        u64::from_le_bytes(ns.data[..8].try_into().unwrap()),
        16 * MIB / 512
    );
    let list = a.identify(2, 0);
    assert_eq!(&list.data[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let desc = a.identify(3, 1);
    // The test's drives are made without a volatile identity: the NQN's.
    let (nguid, uuid) = names::namespace_ids(&nqn, None);
    assert_eq!(&desc.data[4..20], &nguid);
    assert_eq!(&desc.data[24..40], &uuid);
    // Namespace 2 does not exist.
    assert_eq!(a.identify(0, 2).cqe.status, Status::INVALID_NS);
}

fn read_write_round_trip(d: Digests) {
    let s = setup(|_| {});
    let (_a, mut q, _) = controller(s.addr, "ram0", d);
    let small = pattern(4096, 1);
    assert!(q.write(8, &small, true).status.is_success());
    // 1 MiB through R2T and several H2CData PDUs.
    let big = pattern(MIB as usize, 2);
    assert!(q.write(2048, &big, false).status.is_success());
    let r = q.read(8, 8);
    assert!(r.cqe.status.is_success());
    assert_eq!(r.data, small);
    let r = q.read(2048, (MIB / 512) as u32);
    assert!(r.cqe.status.is_success());
    assert_eq!(r.data, big);
    // Never written: zeroes.
    assert_eq!(q.read(100, 1).data, vec![0; 512]);
}

#[test]
fn writes_in_capsule_and_through_r2t_read_back() {
    read_write_round_trip(Digests::default());
}

#[test]
fn header_and_data_digests_when_the_host_asks() {
    read_write_round_trip(Digests {
        header: true,
        data: true,
    });
}

#[test]
fn zeroes_deallocate_and_flush() {
    let s = setup(|_| {});
    let (_a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    let data = pattern(8192, 3);
    assert!(q.write(0, &data, false).status.is_success());
    let mut z = q.rw(io::WRITE_ZEROES, 0, 4);
    z.set_data_ptr(DataPtr::None);
    assert!(q.command(z, &[], &[]).cqe.status.is_success());
    let r = q.read(0, 16);
    assert_eq!(&r.data[..2048], &[0; 2048]);
    assert_eq!(&r.data[2048..], &data[2048..]);
    // Dataset Management, deallocate: one range of 8 blocks at 8.
    let cid = q.cid();
    let mut dsm = Sqe::new(io::DSM, cid, 1);
    dsm.set_cdw(10, 0)
        .set_cdw(11, 1 << 2)
        .set_data_ptr(DataPtr::InCapsule { offset: 0, len: 16 });
    let mut range = vec![0u8; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&8u64.to_le_bytes());
    assert!(q.command(dsm, &range, &[]).cqe.status.is_success());
    assert_eq!(q.read(8, 8).data, vec![0; 4096]);
    let cid = q.cid();
    let mut f = Sqe::new(io::FLUSH, cid, 1);
    f.set_data_ptr(DataPtr::None);
    assert!(q.command(f, &[], &[]).cqe.status.is_success());
}

#[test]
fn out_of_range_and_read_only_get_their_statuses() {
    let s = setup(|_| {});
    let (_a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    let last = 16 * MIB / 512;
    assert_eq!(q.read(last, 1).cqe.status, Status::LBA_RANGE);
    assert_eq!(q.write(last, &[0; 512], true).status, Status::LBA_RANGE);
    assert_eq!(q.read(u64::MAX, 1).cqe.status, Status::LBA_RANGE);
    let (_a, mut ro, _) = controller(s.addr, "ro", Digests::default());
    assert_eq!(
        ro.write(0, &[1; 512], true).status,
        Status::NS_WRITE_PROTECTED
    );
    assert!(ro.read(0, 1).cqe.status.is_success());
    let (mut a, _, _) = controller(s.addr, "ro", Digests::default());
    assert_eq!(a.identify(0, 1).data[99], 1, "NSATTR: write protected");
}

/// Failed commands of every queue land in their controller's error log,
/// newest first, counted in SMART; another controller's log is its own.
#[test]
fn failed_commands_fill_the_error_log() {
    let s = setup(|_| {});
    let (mut a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    let empty = a.log_page(lid::ERROR);
    assert!(empty.cqe.status.is_success());
    assert!(empty.data.iter().all(|&b| b == 0), "no errors yet");
    assert_eq!(a.identify(1, 0).data[262], 63, "ELPE: 64 entries");
    let last = 16 * MIB / 512;
    let first = q.rw(io::READ, last + 7, 1);
    let first_cid = first.cid();
    assert_eq!(q.command(first, &[], &[]).cqe.status, Status::LBA_RANGE);
    assert_eq!(q.write(last, &[0; 512], true).status, Status::LBA_RANGE);
    assert!(
        q.read(0, 1).cqe.status.is_success(),
        "a success is no entry"
    );
    let log = a.log_page(lid::ERROR).data;
    let field = |e: usize, at: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&log[e * 64 + at..][..n]);
        u64::from_le_bytes(b)
    };
    // Newest first: the write (count 2), then the read (count 1).
    assert_eq!(field(0, 0, 8), 2);
    assert_eq!(field(1, 0, 8), 1);
    assert_eq!(field(1, 8, 2), 1, "SQID: the I/O queue");
    assert_eq!(field(1, 10, 2), u64::from(first_cid));
    assert_eq!(
        Status::from_field(field(1, 12, 2) as u16),
        Status::LBA_RANGE
    );
    assert_eq!(field(1, 16, 8), last + 7, "the LBA");
    assert_eq!(field(1, 24, 4), 1, "the namespace");
    assert_eq!(field(2, 0, 8), 0, "nothing older");
    // SMART counts them (Number of Error Information Log Entries).
    let smart = a.log_page(lid::SMART).data;
    assert_eq!(smart[176], 2);
    // An admin command that fails is logged too, with queue 0.
    assert_eq!(a.log_page(0x7F).cqe.status, Status::INVALID_LOG_PAGE);
    let log = a.log_page(lid::ERROR).data;
    assert_eq!(log[0], 3);
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 0);
    // A second controller starts with an empty log.
    let (mut b, _, _) = controller(s.addr, "ram0", Digests::default());
    assert!(b.log_page(lid::ERROR).data.iter().all(|&x| x == 0));
    // Both are the host's, on ram0 (what `ramd info` lists).
    assert_eq!(s.target.hosts_of("ram0"), [(HOST.to_owned(), 2)]);
    assert!(s.target.hosts_of("ro").is_empty());
    drop((a, q));
    common::wait_until("the first controller to go", common::WAIT_TIMEOUT, || {
        s.target.hosts_of("ram0") == [(HOST.to_owned(), 1)]
    });
}

#[test]
fn discovery_lists_every_drive() {
    let s = setup(|_| {});
    let mut a = Client::open(s.addr, Digests::default());
    let c = a.connect(DISCOVERY_NQN, 0, 0xFFFF);
    assert!(c.status.is_success());
    a.enable();
    let id = a.identify(1, 0);
    assert_eq!(id.data[111], 2, "a discovery controller");
    let d = a.log_page(lid::DISCOVERY);
    assert!(d.cqe.status.is_success());
    assert_eq!(u64::from_le_bytes(d.data[8..16].try_into().unwrap()), 2);
    let entry = |i: usize| {
        let e = &d.data[1024 * (i + 1)..1024 * (i + 2)];
        let nqn = &e[256..512];
        let end = nqn.iter().position(|&b| b == 0).unwrap();
        let addr = &e[512..768];
        let aend = addr.iter().position(|&b| b == 0).unwrap();
        (
            String::from_utf8(nqn[..end].to_vec()).unwrap(),
            String::from_utf8(addr[..aend].to_vec()).unwrap(),
        )
    };
    assert_eq!(entry(0).0, names::subsystem_nqn(NODE, "ram0"));
    assert_eq!(entry(0).1, "127.0.0.1");
    assert_eq!(entry(1).0, names::subsystem_nqn(NODE, "ro"));
}

#[test]
fn hosts_off_the_allow_list_are_refused_at_connect() {
    let s = setup(|_| {});
    s.access.set(
        "ram0",
        AccessRules {
            identities: vec!["nqn.2014-08.org.nvmexpress:uuid:someone-else".into()],
            ..AccessRules::default()
        },
    );
    let mut a = Client::open(s.addr, Digests::default());
    let c = a.connect(&names::subsystem_nqn(NODE, "ram0"), 0, 0xFFFF);
    assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
    // A read-only listing makes the namespace write protected for it.
    s.access.set(
        "ram0",
        AccessRules {
            read_only_identities: vec![HOST.into()],
            ..AccessRules::default()
        },
    );
    let (_a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    assert_eq!(
        q.write(0, &[1; 512], true).status,
        Status::NS_WRITE_PROTECTED
    );
    // Unknown subsystems and I/O queues of unknown controllers.
    let mut b = Client::open(s.addr, Digests::default());
    let c = b.connect(&names::subsystem_nqn(NODE, "nope"), 0, 0xFFFF);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAM);
    assert_eq!(c.result, (1 << 16) | 256);
    let mut b = Client::open(s.addr, Digests::default());
    let c = b.connect(&names::subsystem_nqn(NODE, "ro"), 1, 999);
    assert_eq!(c.status, Status::CONNECT_INVALID_PARAM);
}

#[test]
fn a_resized_or_deleted_drive_completes_the_async_event_request() {
    let s = setup(|_| {});
    let (mut a, _q, _) = controller(s.addr, "ram0", Digests::default());
    let cid = a.cid();
    let mut sf = Sqe::new(admin::SET_FEATURES, cid, 0);
    sf.set_cdw(10, 0x0B)
        .set_cdw(11, 1 << 8)
        .set_data_ptr(DataPtr::None);
    assert!(a.command(sf, &[], &[]).cqe.status.is_success());
    let aer_cid = a.cid();
    let mut aer = Sqe::new(admin::ASYNC_EVENT, aer_cid, 0);
    aer.set_data_ptr(DataPtr::None);
    a.send(&Pdu::CapsuleCmd(aer.0), &[]);
    // The drive goes away: the AER completes with a namespace notice.
    let e = s.exports.remove("ram0").unwrap();
    e.close();
    let (p, _) = a.recv();
    let Pdu::CapsuleResp(c) = p else {
        panic!("expected the AER's completion, got {p:?}")
    };
    let cqe = Cqe::decode(&c);
    assert_eq!(cqe.cid, aer_cid);
    assert_eq!(cqe.result & 0xFFFF_FFFF, 2 | (0x04 << 16));
    // The changed namespace list names namespace 1, and it is inactive.
    let d = a.log_page(lid::CHANGED_NS);
    assert_eq!(&d.data[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(a.identify(2, 0).data[..4], [0, 0, 0, 0]);
}

#[test]
fn the_admin_queue_closing_takes_its_io_queues() {
    let s = setup(|_| {});
    let (a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    drop(a);
    // The I/O queue's socket is shut down: the read ends.
    let mut b = [0u8; 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match q.s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(_) => assert!(Instant::now() < deadline, "the I/O queue stayed open"),
        }
    }
}

/// Reads until the server closes; returns a C2HTermReq's FES if one came.
fn term_status(s: &mut TcpStream) -> Option<u16> {
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let b = all.get(..24)?;
    (b[0] == 0x03).then(|| u16::from_le_bytes([b[8], b[9]]))
}

#[test]
fn malformed_pdus_get_a_term_req_and_others_are_served() {
    let s = setup(|_| {});
    let (_a, mut good, _) = controller(s.addr, "ram0", Digests::default());
    // An unknown PDU type after the ICReq.
    let mut bad = Client::open(s.addr, Digests::default());
    bad.s.write_all(&[0x08, 0, 24, 0, 24, 0, 0, 0]).unwrap();
    bad.s.write_all(&[0; 16]).unwrap();
    assert_eq!(
        term_status(&mut bad.s),
        Some(pdu::fes::INVALID_HEADER_FIELD)
    );
    // A capsule claiming a gigabyte.
    let mut bad = Client::open(s.addr, Digests::default());
    let mut h = [4u8, 0, 72, 72, 0, 0, 0, 0];
    h[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
    bad.s.write_all(&h).unwrap();
    assert_eq!(term_status(&mut bad.s), Some(pdu::fes::DATA_LIMIT_EXCEEDED));
    // H2CData nobody asked for.
    let mut bad = Client::open(s.addr, Digests::default());
    let h2c = Pdu::H2CData(pdu::DataHdr {
        command_id: 1,
        ttag: 9,
        offset: 0,
        length: 4,
        last: true,
        success: false,
    });
    bad.send(&h2c, &[0; 4]);
    assert_eq!(
        term_status(&mut bad.s),
        Some(pdu::fes::INVALID_HEADER_FIELD)
    );
    // A bad header digest.
    let d = Digests {
        header: true,
        data: false,
    };
    let mut bad = Client::open(s.addr, d);
    let mut out = Vec::new();
    pdu::encode(&Pdu::CapsuleCmd([0; 64]), &[], d, 0, &mut out);
    out[20] ^= 1;
    bad.s.write_all(&out).unwrap();
    assert_eq!(term_status(&mut bad.s), Some(pdu::fes::HEADER_DIGEST));
    // Commands before Connect fail; the well-behaved host is still served.
    let mut early = Client::open(s.addr, Digests::default());
    let r = early.read(0, 1);
    assert_eq!(r.cqe.status, Status::CMD_SEQ_ERROR);
    assert!(good.read(0, 1).cqe.status.is_success());
}

#[test]
fn a_silent_connection_is_closed_at_the_connect_deadline() {
    let s = setup(|c| c.connect_timeout = Duration::from_millis(300));
    let mut idle = TcpStream::connect(s.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut b = [0u8; 1];
    // The server closes it; the read returns end of file (no ICResp).
    assert_eq!(idle.read(&mut b).unwrap(), 0);
    common::wait_until(
        "the connection slot to be freed",
        common::WAIT_TIMEOUT,
        || s.stop.connections() == 0,
    );
}

/// The same cases every run (a failure can be replayed); set
/// PROPTEST_RNG_SEED to try others.
fn fixed_seed(c: Config) -> Config {
    let rng_seed = match c.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x4e76_6d65_7463),
        fixed => fixed,
    };
    Config { rng_seed, ..c }
}

#[test]
fn random_pdus_never_take_the_target_down() {
    let s = setup(|_| {});
    let (_a, mut good, _) = controller(s.addr, "ram0", Digests::default());
    let mut runner = TestRunner::new(fixed_seed(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    }));
    let pdus = proptest::collection::vec(
        (
            0u8..12,
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..200),
        ),
        1..4,
    );
    runner
        .run(&pdus, |pdus| {
            let mut c = Client::open(s.addr, Digests::default());
            for (t, flags, body) in pdus {
                let mut b = vec![t, flags, 24, 0];
                b.extend_from_slice(&((8 + body.len()) as u32).to_le_bytes());
                b.extend_from_slice(&body);
                if c.s.write_all(&b).is_err() {
                    break;
                }
            }
            let _ = c.s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = c.s.read_to_end(&mut sink);
            Ok(())
        })
        .unwrap();
    assert!(good.read(0, 1).cqe.status.is_success());
}

/// A valid opening (ICReq, Connect to a drive, an in-capsule write, a
/// read, an R2T write) with random bytes changed: whatever the target
/// makes of it, it answers or closes, and other hosts are still served.
#[test]
fn mutated_valid_sessions_never_take_the_target_down() {
    let s = setup(|c| c.connect_timeout = Duration::from_secs(2));
    let (_a, mut good, cntlid) = controller(s.addr, "ram0", Digests::default());
    let nqn = names::subsystem_nqn(NODE, "ram0");
    let mut session = Vec::new();
    let mut pdu_bytes = |p: &Pdu, data: &[u8]| {
        let mut out = Vec::new();
        pdu::encode(p, data, Digests::default(), 0, &mut out);
        session.extend_from_slice(&out);
    };
    let icreq = Pdu::ICReq(pdu::ICReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    });
    pdu_bytes(&icreq, &[]);
    let connect = Connect {
        recfmt: 0,
        qid: 1,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let data = ConnectData {
        hostid: [1; 16],
        cntlid,
        subnqn: nqn,
        hostnqn: HOST.into(),
    }
    .encode();
    pdu_bytes(&Pdu::CapsuleCmd(connect.encode(1).0), &data);
    let mut w = Rw {
        slba: 0,
        nlb: 1,
        fua: false,
        deallocate: false,
    }
    .encode(io::WRITE, 2, 1);
    w.set_data_ptr(DataPtr::InCapsule {
        offset: 0,
        len: 512,
    });
    pdu_bytes(&Pdu::CapsuleCmd(w.0), &[7; 512]);
    let mut r = Rw {
        slba: 0,
        nlb: 8,
        fua: false,
        deallocate: false,
    }
    .encode(io::READ, 3, 1);
    r.set_data_ptr(DataPtr::Transport { len: 4096 });
    pdu_bytes(&Pdu::CapsuleCmd(r.0), &[]);
    let h2c = Pdu::H2CData(pdu::DataHdr {
        command_id: 2,
        ttag: 2,
        offset: 0,
        length: 512,
        last: true,
        success: false,
    });
    pdu_bytes(&h2c, &[9; 512]);
    let mut runner = TestRunner::new(fixed_seed(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    }));
    let edits = proptest::collection::vec((0..session.len(), any::<u8>()), 1..6);
    runner
        .run(&edits, |edits| {
            let mut bytes = session.clone();
            for (at, v) in edits {
                bytes[at] = v;
            }
            let mut c = TcpStream::connect(s.addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let _ = c.write_all(&bytes);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
            Ok(())
        })
        .unwrap();
    assert!(good.read(0, 1).cqe.status.is_success());
    // Every connection of the fuzzing has ended (slots are not leaked).
    common::wait_until(
        "the fuzzing connections to end",
        common::WAIT_TIMEOUT,
        || s.stop.connections() <= 2,
    );
}

/// A drive that cannot serve yet (restoring after a restart) answers a
/// Connect with Controller Busy and no DNR, so a reconnecting host tries
/// again instead of giving up; once its export is replaced by the restored
/// one, I/O queues already connected serve the new one under the same name.
#[test]
fn a_restoring_drive_is_busy_and_a_replaced_export_serves_on() {
    let s = setup(|_| {});
    let pending = Export::new("pdb", "", store(MIB), false)
        .with_unavailable(Box::new(|| "drive 'pdb' is restoring".into()));
    assert!(s.exports.insert(Arc::new(pending)));
    let nqn = names::subsystem_nqn(NODE, "pdb");
    let mut a = Client::open(s.addr, Digests::default());
    let c = a.connect(&nqn, 0, 0xFFFF);
    assert_eq!(c.status, Status::CONNECT_CTRL_BUSY);
    assert!(!c.status.dnr, "the host must try again");

    let (_a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    assert!(q.write(0, &pattern(4096, 7), true).status.is_success());
    // ram0 replaced (a restore finished): the queue follows the name.
    let old = s.exports.remove("ram0").unwrap();
    old.close();
    let fresh = store(16 * MIB);
    fresh.write(0, &pattern(4096, 9), false).unwrap();
    assert!(s
        .exports
        .insert(Arc::new(Export::new("ram0", "", fresh, false))));
    let r = q.read(0, 8);
    assert!(r.cqe.status.is_success(), "{:?}", r.cqe.status);
    assert_eq!(r.data, pattern(4096, 9));
}

/// A RAM drive made again (a daemon restarted: its data is gone) is a new
/// namespace to the host: its NGUID and UUID change, where a drive whose
/// data lasts keeps the NQN's.
#[test]
fn a_ram_drive_made_again_is_a_new_namespace() {
    let s = setup(|_| {});
    let ids = |s: &Setup| {
        let (mut a, _, _) = controller(s.addr, "vol", Digests::default());
        let d = a.identify(3, 1).data;
        (d[4..20].to_vec(), d[24..40].to_vec())
    };
    let make = || Arc::new(Export::new("vol", "", store(MIB), false).with_volatile_identity());
    assert!(s.exports.insert(make()));
    let first = ids(&s);
    assert_eq!(first, ids(&s), "stable while the drive lives");
    s.exports.remove("vol").unwrap().close();
    assert!(s.exports.insert(make()));
    let second = ids(&s);
    assert_ne!(first.0, second.0, "NGUID");
    assert_ne!(first.1, second.1, "UUID");
    let nqn = names::subsystem_nqn(NODE, "vol");
    assert_ne!(first.0, names::namespace_ids(&nqn, None).0.to_vec());
}

/// An I/O queue whose host goes away is closed for good: the host sees
/// its connection end (nothing keeps a copy of the socket open while the
/// controller lives on).
#[test]
fn an_ended_io_queue_is_closed_while_its_controller_lives() {
    let s = setup(|_| {});
    let (mut a, q, _) = controller(s.addr, "ram0", Digests::default());
    q.s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut c = q.s.try_clone().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)
        .expect("the target closes an I/O queue whose host left");
    // The controller (admin queue) still serves.
    assert!(a.identify(1, 0).cqe.status.is_success());
}

/// Reads until the server closes `s` (within 20 s); false if it did not.
fn closes_within_20s(s: &TcpStream) -> bool {
    let mut c = s.try_clone().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).is_ok()
}

/// Access rules changed while a host is connected: a controller whose
/// host the new rules refuse, or allow only to read where it was made
/// for writing, is removed (its admin and I/O queues close, and the
/// host's reconnect is refused); one the rules still allow serves on.
#[test]
fn changed_access_rules_close_the_controllers_they_no_longer_allow() {
    let s = setup(|_| {});
    let rules = |ids: &[&str], ro: &[&str]| AccessRules {
        identities: ids.iter().map(|&i| i.into()).collect(),
        read_only_identities: ro.iter().map(|&i| i.into()).collect(),
        ..AccessRules::default()
    };
    // Still allowed (listed now): nothing closes.
    let (mut a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    s.access.set("ram0", rules(&[HOST], &[]));
    assert_eq!(s.target.recheck_access("ram0"), 0);
    assert!(q.write(0, &[7; 512], true).status.is_success());
    assert!(a.identify(1, 0).cqe.status.is_success());
    // Read-only now, for a controller made for writing: it goes.
    s.access.set("ram0", rules(&[], &[HOST]));
    assert_eq!(s.target.recheck_access("ram0"), 1);
    assert!(closes_within_20s(&a.s), "the admin queue stayed open");
    assert!(closes_within_20s(&q.s), "the I/O queue stayed open");
    assert_eq!(s.target.hosts_of("ram0"), []);
    // A read-only controller made now stays when it is read-only again,
    // and goes when the host is refused; its reconnect is refused.
    let (a, q, _) = controller(s.addr, "ram0", Digests::default());
    s.access
        .set("ram0", rules(&[], &[HOST, "nqn.2014-08.org.example:other"]));
    assert_eq!(s.target.recheck_access("ram0"), 0);
    // Another drive's change touches nothing here.
    assert_eq!(s.target.recheck_access("ro"), 0);
    s.access
        .set("ram0", rules(&["nqn.2014-08.org.example:other"], &[]));
    assert_eq!(s.target.recheck_access("ram0"), 1);
    assert!(closes_within_20s(&a.s) && closes_within_20s(&q.s));
    let mut b = Client::open(s.addr, Digests::default());
    let c = b.connect(&names::subsystem_nqn(NODE, "ram0"), 0, 0xFFFF);
    assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
}

/// Write data that comes by R2T goes into the drive as each H2CData PDU
/// arrives: PDUs of any size (splitting blocks) still leave every block
/// whole; FUA writes (buffered, durable as a whole) too; a write the drive
/// refuses is answered at once, with no R2T and no data sent.
#[test]
fn r2t_writes_land_whole_however_the_host_splits_them() {
    let s = setup(|_| {});
    let (_a, mut q, _) = controller(s.addr, "ram0", Digests::default());
    for (i, piece) in [1000usize, 513, 4103, 511, 128 * 1024]
        .into_iter()
        .enumerate()
    {
        q.h2c_piece = Some(piece);
        let data = pattern(64 * 1024 + 512 * i, i as u8 + 10);
        let slba = 4096 * i as u64 + 3;
        assert!(
            q.write(slba, &data, false).status.is_success(),
            "piece {piece}"
        );
        let r = q.read(slba, (data.len() / 512) as u32);
        assert_eq!(r.data, data, "H2CData of {piece} bytes");
    }
    // FUA, through R2T.
    q.h2c_piece = Some(777);
    let data = pattern(32 * 1024, 40);
    let cid = q.cid();
    let mut w = Rw {
        slba: 20_000,
        nlb: 64,
        fua: true,
        deallocate: false,
    }
    .encode(io::WRITE, cid, 1);
    w.set_data_ptr(DataPtr::Transport { len: 32 * 1024 });
    assert!(q.command(w, &[], &data).cqe.status.is_success());
    assert_eq!(q.read(20_000, 64).data, data);
    // Refused before any transfer: past the end, and a read-only drive.
    let before = q.r2ts;
    let last = 16 * MIB / 512;
    assert_eq!(
        q.write(last - 1, &[5; 8192], false).status,
        Status::LBA_RANGE
    );
    let (_a2, mut ro, _) = controller(s.addr, "ro", Digests::default());
    assert_eq!(
        ro.write(0, &[5; 65536], false).status,
        Status::NS_WRITE_PROTECTED
    );
    assert_eq!((q.r2ts, ro.r2ts), (before, 0), "a refused write got an R2T");
    // The queue serves on.
    assert!(q.write(0, &[6; 65536], false).status.is_success());
}

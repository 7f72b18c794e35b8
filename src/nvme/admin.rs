//! Fabrics Connect and Property Get/Set, and the admin command set of
//! both controller kinds (discovery and drive): Identify, Get/Set
//! Features, Get Log Page, Keep Alive, Asynchronous Event Request, Abort.
//!
//! Asynchronous events: the admin queue wakes every `ADMIN_TICK` (and
//! after every batch of commands) and compares what it last told the host
//! with what is true now: the drive's presence, size and read-only state
//! (a Namespace Attribute Changed notice, then the Changed Namespace List
//! log), or the list of drives (a Discovery Log Change notice). An event
//! completes one outstanding AER; with none outstanding it waits for the
//! next. Polling, not callbacks, so the drive registry needs no hook for
//! this frontend and a missed change is impossible: the comparison is
//! against the state itself.

use std::time::{Duration, Instant};

use super::conn::{ConnError, Queue};
use super::identify::{self, cns, CtrlInfo, CtrlType, NsInfo};
use super::log::{self, lid, DiscoveryEntry, Health, LogRequest};
use super::names;
use super::sqe::{self, admin, prop, Connect, ConnectData, Property, Sqe, Status};
use super::state::{AdminState, LBA_SHIFT};
use super::target::{ConnectRefusal, Serves};
use crate::nbd::access::Grant;

/// The NVMe version this controller reports (1.3: namespace descriptor
/// lists, which Linux reads for the stable UUID/NGUID).
const VERSION: u32 = 0x0001_0300;
/// Keep-alive granularity in 100 ms units.
const KAS: u16 = 10;
/// Outstanding AERs per controller.
const AER_LIMIT: usize = 4;
/// Feature identifiers.
const FEAT_VWC: u8 = 0x06;
const FEAT_NUM_QUEUES: u8 = 0x07;
const FEAT_ASYNC_EVENT: u8 = 0x0B;
const FEAT_KATO: u8 = 0x0F;
/// AER result: type notice (2), info and log page.
// (info 0x00: namespace attribute changed)
const AEN_NS_CHANGED: u64 = 2 | ((lid::CHANGED_NS as u64) << 16);
const AEN_DISC_CHANGED: u64 = 2 | (0xF0 << 8) | ((lid::DISCOVERY as u64) << 16);

/// Asynchronous Event Configuration bits.
const AEN_CFG_NS_ATTR: u32 = 1 << 8;
const AEN_CFG_DISC_CHANGE: u32 = 1 << 31;

impl Queue {
    pub(super) fn connect(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        let cid = sqe.cid();
        if self.ctrl.is_some() {
            return self.reply(cid, Status::CMD_SEQ_ERROR, 0);
        }
        let c = Connect::parse(sqe);
        let d = match ConnectData::parse(data) {
            Ok(d) => d,
            Err(e) => return self.reply(cid, Status::CONNECT_INVALID_PARAM, iattr(e.offset)),
        };
        if c.recfmt != 0 {
            return self.reply(cid, Status::CONNECT_FORMAT, 0);
        }
        let max = self.target.config.queue_entries;
        if c.sqsize == 0 || c.sqsize >= max {
            return self.reply(cid, Status::CONNECT_INVALID_PARAM, ipo(44));
        }
        let refused = |r: ConnectRefusal| match r {
            ConnectRefusal::UnknownSubsystem => (Status::CONNECT_INVALID_PARAM, iattr(256)),
            ConnectRefusal::HostNotAllowed => (Status::CONNECT_INVALID_HOST, 0),
            ConnectRefusal::UnknownController => (Status::CONNECT_INVALID_PARAM, iattr(16)),
            ConnectRefusal::Busy | ConnectRefusal::NotReady { .. } => {
                (Status::CONNECT_CTRL_BUSY, 0)
            }
        };
        let ctrl = if c.qid == 0 {
            self.target.create_controller(
                &d.subnqn,
                &d.hostnqn,
                d.hostid,
                &self.source,
                &self.stream,
            )
        } else {
            self.target.find_controller(d.cntlid, &d.subnqn, &d.hostnqn)
        };
        let ctrl = match ctrl {
            Ok(c) => c,
            Err(r) => {
                tracing::info!(host = %d.hostnqn, subsystem = %d.subnqn, "NVMe/TCP connect refused: {r:?}");
                let (s, res) = refused(r);
                return self.reply(cid, s, res);
            }
        };
        if c.qid > 0 {
            let granted = ctrl.io_queues.load(std::sync::atomic::Ordering::SeqCst);
            if c.qid > granted || !ctrl.add_queue(&self.stream) {
                return self.reply(cid, Status::CONNECT_INVALID_PARAM, ipo(42));
            }
            if let Serves::Drive { name, .. } = &ctrl.serves {
                self.export = self.target.exports.get(name);
                self.recorder = self
                    .export
                    .as_ref()
                    .and_then(|e| e.metrics.as_ref().map(|m| m.connection()));
            }
        }
        self.qid = c.qid;
        self.entries = c.sqsize + 1;
        let cntlid = ctrl.cntlid;
        self.ctrl = Some(ctrl);
        if c.qid == 0 {
            self.admin = Some(self.new_admin(c.kato_ms));
        }
        self.reply(cid, Status::SUCCESS, u64::from(cntlid))
    }

    /// The admin queue's state, once `self.ctrl` is set.
    fn new_admin(&self, kato_ms: u32) -> AdminState {
        let mut a = AdminState {
            cc: 0,
            csts: 0,
            kato: Duration::from_millis(u64::from(kato_ms)),
            last_seen: Instant::now(),
            aen_config: 0,
            aers: Vec::new(),
            told: (false, 0, false),
            told_list: Vec::new(),
            event_due: None,
            ns_changed: false,
            genctr: 1,
            started: Instant::now(),
        };
        match &self.ctrl.as_ref().expect("connected").serves {
            Serves::Discovery => a.told_list = self.discovery_names(),
            Serves::Drive { .. } => a.told = self.ns_state(),
        }
        a
    }

    pub(super) fn property(&mut self, sqe: &Sqe) -> Result<(), ConnError> {
        let p = Property::parse(sqe);
        let a = self.admin.as_mut().expect("admin queue");
        let cap: u64 =
            (1 << 37) | (15 << 24) | (1 << 16) | u64::from(self.target.config.queue_entries - 1);
        if sqe.fctype() == sqe::fctype::PROPERTY_SET {
            if p.offset != prop::CC {
                return self.reply(sqe.cid(), Status::INVALID_FIELD, 0);
            }
            let cc = p.value as u32;
            a.csts = if cc & 1 != 0 { 1 } else { 0 };
            if (cc >> 14) & 3 != 0 {
                a.csts |= 2 << 2; // shutdown complete: nothing to write back
            }
            a.cc = cc;
            return self.reply(sqe.cid(), Status::SUCCESS, 0);
        }
        let v = match p.offset {
            prop::CAP => cap,
            prop::VS => u64::from(VERSION),
            prop::CC => u64::from(a.cc),
            prop::CSTS => u64::from(a.csts),
            _ => return self.reply(sqe.cid(), Status::INVALID_FIELD, 0),
        };
        self.reply(sqe.cid(), Status::SUCCESS, v)
    }

    pub(super) fn admin_command(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), ConnError> {
        let cid = sqe.cid();
        let a = self.admin.as_mut().expect("admin queue");
        a.last_seen = Instant::now();
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(sqe),
            admin::GET_LOG_PAGE => self.get_log(sqe),
            admin::SET_FEATURES => self.set_features(sqe, data),
            admin::GET_FEATURES => self.get_features(sqe),
            admin::KEEP_ALIVE => self.reply(cid, Status::SUCCESS, 0),
            admin::ABORT => self.reply(cid, Status::SUCCESS, 1), // not aborted
            admin::ASYNC_EVENT => {
                if a.aers.len() >= AER_LIMIT {
                    return self.reply(cid, Status::ASYNC_LIMIT, 0);
                }
                a.aers.push(cid);
                self.deliver_events()
            }
            _ => self.reply(cid, Status::INVALID_OPCODE, 0),
        }
    }

    /// The namespace ids of the drive `subnqn` names, as it is now (a RAM
    /// drive created again has new ones: `Export::incarnation`).
    fn namespace_ids(&self, subnqn: &str) -> ([u8; 16], [u8; 16]) {
        let incarnation = self.target.drive(subnqn).and_then(|e| e.incarnation);
        names::namespace_ids(subnqn, incarnation.as_ref())
    }

    fn ctrl_info(&self) -> CtrlInfo {
        let ctrl = self.ctrl.as_ref().expect("connected");
        let c = &self.target.config;
        let (kind, serial) = match &ctrl.serves {
            Serves::Discovery => (CtrlType::Discovery, "discovery".to_owned()),
            Serves::Drive { .. } => {
                let (nguid, _) = self.namespace_ids(&ctrl.subnqn);
                let hex: String = nguid[..10].iter().map(|b| format!("{b:02x}")).collect();
                (CtrlType::Io, hex)
            }
        };
        CtrlInfo {
            kind,
            cntlid: ctrl.cntlid,
            serial,
            model: "ramd RAM drive".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            subnqn: ctrl.subnqn.clone(),
            version: VERSION,
            mdts: c.mdts,
            maxcmd: c.queue_entries,
            nn: u32::from(kind == CtrlType::Io),
            in_capsule_bytes: c.in_capsule_bytes,
            aer_limit: AER_LIMIT as u8,
            kas: KAS,
            volatile_write_cache: true,
        }
    }

    fn identify(&mut self, sqe: &Sqe) -> Result<(), ConnError> {
        let max = sgl_len(sqe);
        let cns = sqe.cdw(10) as u8;
        let is_drive = matches!(
            self.ctrl.as_ref().map(|c| &c.serves),
            Some(Serves::Drive { .. })
        );
        let page = match cns {
            cns::CTRL => identify::controller(&self.ctrl_info()),
            cns::NS | cns::NS_DESC_LIST if is_drive => {
                if sqe.nsid() != 1 {
                    return self.reply(sqe.cid(), Status::INVALID_NS, 0);
                }
                let subnqn = self.ctrl.as_ref().expect("connected").subnqn.clone();
                let (nguid, uuid) = self.namespace_ids(&subnqn);
                let (present, blocks, ro) = self.ns_state();
                match (cns, present) {
                    (cns::NS, true) => identify::namespace(&NsInfo {
                        blocks,
                        lba_shift: LBA_SHIFT,
                        read_only: ro,
                        nguid,
                    }),
                    // An inactive namespace: all zeroes.
                    (cns::NS, false) => vec![0; identify::PAGE],
                    _ => identify::ns_descriptors(&nguid, &uuid),
                }
            }
            cns::ACTIVE_NS_LIST if is_drive => {
                let active: &[u32] = if self.ns_state().0 { &[1] } else { &[] };
                identify::active_ns_list(active, sqe.nsid())
            }
            _ => return self.reply(sqe.cid(), Status::INVALID_FIELD, 0),
        };
        self.send_data(sqe.cid(), &page, max)
    }

    fn get_log(&mut self, sqe: &Sqe) -> Result<(), ConnError> {
        let req = LogRequest::parse(sqe);
        let max_len = self.target.config.max_transfer();
        let is_drive = matches!(
            self.ctrl.as_ref().map(|c| &c.serves),
            Some(Serves::Drive { .. })
        );
        let page = match req.lid {
            lid::DISCOVERY if !is_drive => {
                let a = self.admin.as_ref().expect("admin queue");
                log::discovery(a.genctr, &self.discovery_entries())
            }
            lid::ERROR => self
                .ctrl
                .as_ref()
                .map_or_else(|| vec![0; 64], |c| c.errors.lock().page()),
            lid::FW_SLOT => vec![0; 512],
            lid::SMART if is_drive => log::smart(&self.health()),
            lid::CHANGED_NS if is_drive => {
                let a = self.admin.as_mut().expect("admin queue");
                let list: &[u32] = if a.ns_changed { &[1] } else { &[] };
                let p = log::changed_ns(list);
                if !req.rae {
                    a.ns_changed = false;
                }
                p
            }
            _ => return self.reply(sqe.cid(), Status::INVALID_LOG_PAGE, 0),
        };
        match log::window(&page, &req, max_len) {
            Ok(w) => {
                let max = sgl_len(sqe);
                self.send_data(sqe.cid(), &w, max)
            }
            Err(s) => self.reply(sqe.cid(), s, 0),
        }
    }

    fn set_features(&mut self, sqe: &Sqe, _data: &[u8]) -> Result<(), ConnError> {
        let fid = sqe.cdw(10) as u8;
        if sqe.cdw(10) & (1 << 31) != 0 {
            return self.reply(sqe.cid(), Status::FEATURE_NOT_SAVEABLE, 0);
        }
        let v = sqe.cdw(11);
        let max_q = self.target.config.max_io_queues;
        let ctrl = self.ctrl.clone().expect("connected");
        let a = self.admin.as_mut().expect("admin queue");
        match fid {
            FEAT_NUM_QUEUES => {
                let want = (v & 0xFFFF).min(v >> 16) as u16;
                if want == 0xFFFF {
                    return self.reply(sqe.cid(), Status::INVALID_FIELD, 0);
                }
                let n = (want + 1).min(max_q);
                ctrl.io_queues.store(n, std::sync::atomic::Ordering::SeqCst);
                let r = u64::from(n - 1) | u64::from(n - 1) << 16;
                self.reply(sqe.cid(), Status::SUCCESS, r)
            }
            FEAT_KATO => {
                a.kato = Duration::from_millis(u64::from(v));
                self.reply(sqe.cid(), Status::SUCCESS, 0)
            }
            FEAT_ASYNC_EVENT => {
                a.aen_config = v;
                self.reply(sqe.cid(), Status::SUCCESS, 0)
            }
            FEAT_VWC => self.reply(sqe.cid(), Status::SUCCESS, 0),
            _ => self.reply(sqe.cid(), Status::INVALID_FIELD, 0),
        }
    }

    fn get_features(&mut self, sqe: &Sqe) -> Result<(), ConnError> {
        let fid = sqe.cdw(10) as u8;
        let ctrl = self.ctrl.clone().expect("connected");
        let a = self.admin.as_ref().expect("admin queue");
        let r = match fid {
            FEAT_NUM_QUEUES => {
                let n = u64::from(
                    ctrl.io_queues
                        .load(std::sync::atomic::Ordering::SeqCst)
                        .max(1)
                        - 1,
                );
                n | n << 16
            }
            FEAT_KATO => a.kato.as_millis() as u64,
            FEAT_ASYNC_EVENT => u64::from(a.aen_config),
            FEAT_VWC => 1,
            _ => return self.reply(sqe.cid(), Status::INVALID_FIELD, 0),
        };
        self.reply(sqe.cid(), Status::SUCCESS, r)
    }

    /// The drive's (present, blocks, read-only) now, following a drive
    /// that was deleted and created again under the same name.
    pub(super) fn ns_state(&self) -> (bool, u64, bool) {
        let Some(Serves::Drive {
            name,
            read_only_host,
        }) = self.ctrl.as_ref().map(|c| &c.serves)
        else {
            return (false, 0, false);
        };
        match self
            .target
            .exports
            .get(name)
            .filter(|e| !e.is_closed() && &e.name == name)
        {
            Some(e) => (
                true,
                e.backend.size() >> LBA_SHIFT,
                e.is_read_only() || *read_only_host,
            ),
            None => (false, 0, false),
        }
    }

    fn discovery_names(&self) -> Vec<String> {
        self.discovery_entries()
            .into_iter()
            .map(|e| e.subnqn)
            .collect()
    }

    fn discovery_entries(&self) -> Vec<DiscoveryEntry> {
        let hostnqn = self
            .ctrl
            .as_ref()
            .map(|c| c.hostnqn.clone())
            .unwrap_or_default();
        self.target
            .exports
            .list()
            .into_iter()
            .filter(|e| !e.is_closed())
            .filter(|e| self.target.grant(&e.name, &hostnqn, &self.source) != Grant::Denied)
            .map(|e| DiscoveryEntry {
                subnqn: self.target.nqn(&e.name),
                traddr: self.local.ip().to_string(),
                trsvcid: self.local.port().to_string(),
                ipv6: self.local.is_ipv6(),
                portid: 1,
            })
            .collect()
    }

    fn health(&self) -> Health {
        let ro = self.ns_state().2;
        let a = self.admin.as_ref().expect("admin queue");
        let mut h = Health {
            read_only: ro,
            errors: self.ctrl.as_ref().map_or(0, |c| c.errors.lock().count()),
            power_on_hours: a.started.elapsed().as_secs() / 3600,
            ..Health::default()
        };
        let Some(Serves::Drive { name, .. }) = self.ctrl.as_ref().map(|c| &c.serves) else {
            return h;
        };
        if let Some(m) = self
            .target
            .exports
            .get(name)
            .and_then(|e| e.metrics.clone())
        {
            let t = m.snapshot();
            use crate::metrics::Op;
            h.bytes_read = t.bytes[Op::Read as usize];
            h.bytes_written = t.bytes[Op::Write as usize];
            h.read_commands = t.ops[Op::Read as usize];
            h.write_commands = t.ops[Op::Write as usize];
        }
        h
    }

    /// Keep-alive and events, on the admin queue's tick.
    pub(super) fn tick(&mut self) -> Result<(), ConnError> {
        if let Some(a) = &self.admin {
            if !a.kato.is_zero() && a.last_seen.elapsed() > a.kato + a.kato / 2 {
                return Err(ConnError::KeepAliveExpired);
            }
        }
        self.deliver_events()
    }

    /// Notices a change since the host was last told, and completes an
    /// outstanding AER with it (see the module docs).
    pub(super) fn deliver_events(&mut self) -> Result<(), ConnError> {
        let is_drive = matches!(
            self.ctrl.as_ref().map(|c| &c.serves),
            Some(Serves::Drive { .. })
        );
        let (ns_now, list_now) = if is_drive {
            (self.ns_state(), Vec::new())
        } else {
            ((false, 0, false), self.discovery_names())
        };
        let Some(a) = self.admin.as_mut() else {
            return Ok(());
        };
        // Notices go out only when the host enabled them (Set Features,
        // Asynchronous Event Configuration), as the specification asks.
        if is_drive && ns_now != a.told {
            a.told = ns_now;
            a.ns_changed = true;
            if a.aen_config & AEN_CFG_NS_ATTR != 0 {
                a.event_due = Some(AEN_NS_CHANGED);
            }
        } else if !is_drive && list_now != a.told_list {
            a.told_list = list_now;
            a.genctr += 1;
            if a.aen_config & AEN_CFG_DISC_CHANGE != 0 {
                a.event_due = Some(AEN_DISC_CHANGED);
            }
        }
        if a.event_due.is_some() && !a.aers.is_empty() {
            let r = a.event_due.take().expect("due");
            let cid = a.aers.remove(0);
            self.reply(cid, Status::SUCCESS, r)?;
            self.flush()?;
        }
        Ok(())
    }
}

/// A Connect refusal's result naming a field of the Connect data.
fn iattr(offset: u32) -> u64 {
    u64::from((1 << 16) | offset)
}

/// A Connect refusal's result naming a byte of the SQE.
fn ipo(offset: u32) -> u64 {
    u64::from(offset)
}

/// The bytes the command's data pointer allows.
fn sgl_len(sqe: &Sqe) -> usize {
    match sqe.data_ptr() {
        Some(sqe::DataPtr::Transport { len }) | Some(sqe::DataPtr::InCapsule { len, .. }) => {
            len as usize
        }
        _ => 0,
    }
}

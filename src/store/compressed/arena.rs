//! Where a compressed drive's bytes live: 4 KiB pages carved from large
//! anonymous mappings (`store::region`), one arena per drive.
//!
//! ```text
//!  regions: [mapping][mapping]...   (2-64 MiB each, added as pages are needed)
//!  a page:  4 KiB of a mapping, handed to a size class (pool.rs) or held
//!           by a page-table entry as a raw page
//!  given back: cached (resident, still charged) up to CACHE_MAX_PAGES (and
//!           an eighth of the pages held), else released (MADV_DONTNEED: RSS
//!           drops, the page reads as zero)
//! ```
//!
//! Regions are a sixteenth of the drive's promise `min(size, mem_limit)`,
//! 2-64 MiB ([`region_bytes_for`]): few mappings for a large drive, little
//! address space beyond its promise for a small one. A drive whose memory
//! is locked in RAM (`--lock-memory`) locks each region as it maps it
//! (`mlock2(MLOCK_ONFAULT)`: pages are locked as they are faulted in), so
//! its locked mappings never exceed its promise by more than one region:
//! the arena hands out every free page before it maps another region, and
//! the pages held never pass the drive's limit. The kernel charges
//! `RLIMIT_MEMLOCK` per locked mapping, which the daemon checks against
//! that bound before a locked drive is created (`control::drives::memlock`).
//!
//! # Accounting
//!
//! Every page out of the arena or in its cache is charged to the drive's
//! budgets ([`Charge`]); a released page is not. So the bytes charged are
//! exactly the resident pages of the drive's data, and its RSS follows
//! them down as soon as pages are released. The cache exists because a
//! drive under overwrites frees a page about as often as it needs one:
//! releasing each at once would cost a `madvise` (and the TLB shootdown
//! that comes with it) per free and a page fault per new page. Pages
//! beyond the cap are released in one batch, and
//! [`PageArena::release_cache`] (`CompressedStore::compact`) releases the
//! rest.
//!
//! Why not heap blocks (the first design): glibc keeps freed chunks in its
//! arenas, so RSS did not follow trims without `malloc_trim`, and a class's
//! unit of growth was a whole 4-32 KiB block; pages of one size let every
//! size class grow and shrink by 4 KiB (`pool.rs`).

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

use super::keep::{Keep, KeepError, Owner};
use crate::store::memfd;
use crate::store::region::Region;

/// Bytes of one arena page.
pub const PAGE_BYTES: usize = 4096;
/// Pages given back that stay resident (and charged) for reuse.
pub const CACHE_MAX_PAGES: usize = 64;

/// Most free pages kept for a drive holding `out` pages: an eighth of
/// them, at most [`CACHE_MAX_PAGES`] (none when it holds nothing, so a
/// drive trimmed empty holds and is charged nothing).
fn cache_cap(out: u64) -> usize {
    CACHE_MAX_PAGES.min((out / 8) as usize)
}

/// Bytes of each mapping of a drive promised `promise_bytes` (see the
/// module docs).
pub fn region_bytes_for(promise_bytes: u64) -> usize {
    let sixteenth = (promise_bytes / 16).clamp(2 << 20, 64 << 20);
    sixteenth.next_power_of_two() as usize
}

/// Charges and releases the memory of pages (the drive's limit and the
/// daemon's budget).
pub trait Charge {
    /// Reserves `bytes`; false when a limit would be passed.
    fn reserve(&self, bytes: u64) -> bool;
    /// Gives back `bytes` reserved earlier.
    fn release(&self, bytes: u64);
}

/// Why no page could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoPage {
    /// A budget (the drive's limit or the daemon's) is full.
    #[error("no memory left in the budget for another page")]
    Budget,
    /// A new region could not be mapped or locked (`errno`).
    #[error("a new region could not be mapped or locked (errno {0})")]
    Map(i32),
}

/// One 4 KiB page of an arena, owned by one size class or one page-table
/// entry. It is a plain address: the owner knows what it holds, and the
/// lock that guards the owner guards the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page(NonNull<u8>);

// SAFETY: a page is plain memory inside a mapping of the drive's arena;
// its owner only reads or writes it under the lock that guards the owner.
unsafe impl Send for Page {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Page {}

impl Page {
    /// The page at `addr` (a value of [`Page::addr`]).
    pub fn from_addr(addr: usize) -> Page {
        debug_assert!(addr % PAGE_BYTES == 0);
        Page(NonNull::new(addr as *mut u8).expect("a page is not at address 0"))
    }

    /// The page's address (4 KiB aligned).
    pub fn addr(self) -> usize {
        self.0.as_ptr() as usize
    }

    /// The page's bytes.
    ///
    /// # Safety
    /// The caller owns the page (it came from this drive's arena, was not
    /// given back, and the arena lives), and holds the lock that guards
    /// its owner, shared at least.
    #[inline]
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        // SAFETY: the caller's contract: PAGE_BYTES of a live mapping, not
        // changed while the owner's lock is held.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), PAGE_BYTES) }
    }

    /// The page's bytes, to change.
    ///
    /// # Safety
    /// As [`Page::bytes`], with the owner's lock held exclusively.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        // SAFETY: the caller's contract: nobody else reads or writes it.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), PAGE_BYTES) }
    }
}

/// A mapped region and its place in the arena (region `index` is at
/// `index * region_bytes` of a kept arena's memfd).
struct Carved {
    region: Region,
    index: usize,
}

struct Inner {
    /// By base address, so a page finds its region.
    regions: BTreeMap<usize, Carved>,
    /// Base addresses by region index.
    bases: Vec<usize>,
    /// The region new pages are carved from and how much of it is used.
    last: Option<(usize, usize)>,
    /// Given back and released (they read as zero), reused first after
    /// the cache.
    released: Vec<Page>,
    /// Given back, still resident and charged.
    cached: Vec<Page>,
    /// Pages held by the drive (not in the arena).
    out: u64,
}

/// The pages of one drive.
pub struct PageArena {
    inner: Mutex<Inner>,
    /// Bytes of each mapping.
    region_bytes: usize,
    /// Regions are locked in RAM as they are mapped (`--lock-memory`).
    locked: bool,
    /// The memfds of a drive kept across restarts (`keep.rs`): regions are
    /// mapped from its arena memfd, class pages noted in its page map.
    keep: Option<Arc<Keep>>,
}

impl PageArena {
    /// An arena of mappings of `region_bytes` (a multiple of 2 MiB),
    /// locked in RAM with `locked`.
    pub fn new(region_bytes: usize, locked: bool) -> PageArena {
        PageArena::with_keep(region_bytes, locked, None)
    }

    /// [`PageArena::new`] over the memfds of `keep` (`keep.rs`; None:
    /// anonymous memory).
    pub fn with_keep(region_bytes: usize, locked: bool, keep: Option<Arc<Keep>>) -> PageArena {
        debug_assert!(region_bytes % (2 << 20) == 0);
        PageArena {
            inner: Mutex::new(Inner {
                regions: BTreeMap::new(),
                bases: Vec::new(),
                last: None,
                released: Vec::new(),
                cached: Vec::new(),
                out: 0,
            }),
            region_bytes,
            locked,
            keep,
        }
    }

    /// The arena a killed process left in `keep`: every region mapped
    /// again, the pages `held(index)` says are held out (charged by the
    /// caller: [`PageArena::charged_pages`]), every other page released
    /// (its memory freed; a page the process had cached was resident).
    pub fn adopt(
        keep: Arc<Keep>,
        locked: bool,
        held: impl Fn(u64) -> bool,
    ) -> Result<PageArena, KeepError> {
        let rb = keep.region_bytes();
        let arena = PageArena::with_keep(rb, locked, Some(keep.clone()));
        let per = (rb / PAGE_BYTES) as u64;
        let mut g = arena.inner.lock();
        for i in 0..keep.regions() {
            let base = arena.map_region(&mut g, i)?;
            g.last = Some((base, rb));
            let mut free_run: Option<u64> = None;
            for j in 0..=per {
                let free = j < per && !held(i as u64 * per + j);
                match (free, free_run) {
                    (true, None) => free_run = Some(j),
                    (false, Some(from)) => {
                        let (at, len) =
                            (from as usize * PAGE_BYTES, (j - from) as usize * PAGE_BYTES);
                        g.regions[&base].region.release(at, len);
                        g.released.extend(
                            (from..j).map(|k| Page::from_addr(base + k as usize * PAGE_BYTES)),
                        );
                        free_run = None;
                    }
                    _ => {}
                }
                if j < per && !free {
                    g.out += 1;
                }
            }
        }
        drop(g);
        Ok(arena)
    }

    /// Maps region `index` (of the kept memfd, or anonymous), locked when
    /// the drive is; returns its base address.
    fn map_region(&self, g: &mut Inner, index: usize) -> io::Result<usize> {
        let rb = self.region_bytes;
        let r = match &self.keep {
            Some(k) => {
                memfd::grow_to(k.arena_fd(), (index + 1) * rb).map_err(io::Error::from)?;
                Region::shared(k.arena_fd(), index * rb, rb, false)?
            }
            None => Region::new(rb, false)?,
        };
        if self.locked {
            r.lock_to(rb)?;
        }
        let base = r.ptr(0) as usize;
        g.regions.insert(base, Carved { region: r, index });
        g.bases.push(base);
        if let Some(k) = &self.keep {
            k.set_regions(index + 1);
        }
        Ok(base)
    }

    /// The index of an arena page (its offset in the kept memfd / 4 KiB).
    pub fn index_of(&self, page: Page) -> u64 {
        let g = self.inner.lock();
        let (&base, c) = g
            .regions
            .range(..=page.addr())
            .next_back()
            .expect("a page of this arena");
        ((c.index * self.region_bytes + (page.addr() - base)) / PAGE_BYTES) as u64
    }

    /// The page of index `index` (see [`PageArena::index_of`]), if mapped.
    pub fn page_at(&self, index: u64) -> Option<Page> {
        let per = (self.region_bytes / PAGE_BYTES) as u64;
        let g = self.inner.lock();
        let base = *g.bases.get((index / per) as usize)?;
        Some(Page::from_addr(base + (index % per) as usize * PAGE_BYTES))
    }

    /// The kept memfds, if the drive is kept.
    pub fn keep(&self) -> Option<&Arc<Keep>> {
        self.keep.as_ref()
    }

    /// Notes in a kept drive's page map that `page` is page `owner.index`
    /// of a class, or no class's page (nothing for an unkept drive).
    pub fn note_owner(&self, page: Page, owner: Option<Owner>) {
        if let Some(k) = &self.keep {
            k.set_owner(self.index_of(page), owner);
        }
    }

    /// A page for the drive, charged to `mem` unless it comes from the
    /// cache (charged already). Its bytes are unspecified.
    pub fn take(&self, mem: &impl Charge) -> Result<Page, NoPage> {
        let mut g = self.inner.lock();
        if let Some(p) = g.cached.pop() {
            g.out += 1;
            return Ok(p);
        }
        if !mem.reserve(PAGE_BYTES as u64) {
            return Err(NoPage::Budget);
        }
        let page = match g.released.pop() {
            Some(p) => Ok(p),
            None => self.carve(&mut g),
        };
        match page {
            Ok(p) => {
                g.out += 1;
                Ok(p)
            }
            Err(e) => {
                mem.release(PAGE_BYTES as u64);
                Err(NoPage::Map(e.raw_os_error().unwrap_or(libc::ENOMEM)))
            }
        }
    }

    /// A page never handed out before, mapping (and locking) a region when
    /// the last one is used up.
    fn carve(&self, g: &mut Inner) -> io::Result<Page> {
        let (base, used) = match g.last {
            Some((base, used)) if used < self.region_bytes => (base, used),
            _ => {
                let index = g.bases.len();
                let pages = (index + 1) * self.region_bytes / PAGE_BYTES;
                if self.keep.is_some() && pages > super::keep::MAX_ARENA_PAGES {
                    return Err(io::Error::from_raw_os_error(libc::ENOSPC));
                }
                (self.map_region(g, index)?, 0)
            }
        };
        g.last = Some((base, used + PAGE_BYTES));
        Ok(Page::from_addr(base + used))
    }

    /// Takes back a page the drive no longer holds: cached, or released
    /// with the oldest cached ones when the cache is full.
    pub fn give(&self, page: Page, mem: &impl Charge) {
        let mut g = self.inner.lock();
        g.out -= 1;
        g.cached.push(page);
        let cap = cache_cap(g.out);
        if g.cached.len() > cap {
            let n = g.cached.len() - cap / 2;
            self.release(&mut g, n, mem);
        }
    }

    /// Releases every cached page; returns the bytes released.
    pub fn release_cache(&self, mem: &impl Charge) -> u64 {
        let mut g = self.inner.lock();
        let n = g.cached.len();
        self.release(&mut g, n, mem);
        (n * PAGE_BYTES) as u64
    }

    /// Releases the `n` oldest cached pages (adjacent ones in one call).
    fn release(&self, g: &mut Inner, n: usize, mem: &impl Charge) {
        let mut pages: Vec<Page> = g.cached.drain(..n).collect();
        pages.sort_by_key(|p| p.addr());
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j].addr() == pages[j - 1].addr() + PAGE_BYTES {
                j += 1;
            }
            let (addr, len) = (pages[i].addr(), (j - i) * PAGE_BYTES);
            let (&base, c) = g
                .regions
                .range(..=addr)
                .next_back()
                .expect("a page of this arena");
            debug_assert!(addr + len <= base + c.region.len());
            c.region.release(addr - base, len);
            i = j;
        }
        g.released.extend_from_slice(&pages);
        mem.release((n * PAGE_BYTES) as u64);
    }

    /// Pages charged: held by the drive plus cached.
    pub fn charged_pages(&self) -> u64 {
        let g = self.inner.lock();
        g.out + g.cached.len() as u64
    }

    /// Pages held by the drive (not cached).
    pub fn out_pages(&self) -> u64 {
        self.inner.lock().out
    }

    /// Pages cached (resident, charged, free).
    #[cfg(test)]
    pub fn cached_pages(&self) -> u64 {
        self.inner.lock().cached.len() as u64
    }

    /// Bytes of each mapping.
    pub fn region_bytes(&self) -> usize {
        self.region_bytes
    }

    /// Bytes mapped (for a locked drive: what the kernel counts against
    /// `RLIMIT_MEMLOCK`).
    pub fn mapped_bytes(&self) -> u64 {
        (self.inner.lock().regions.len() * self.region_bytes) as u64
    }

    /// Bytes of the arena's own bookkeeping.
    pub fn metadata_bytes(&self) -> u64 {
        let g = self.inner.lock();
        (std::mem::size_of::<PageArena>()
            + g.regions.len() * (std::mem::size_of::<Carved>() + 4 * 8)
            + (g.released.capacity() + g.cached.capacity()) * std::mem::size_of::<Page>())
            as u64
    }

    /// True when the drive's memory is locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[derive(Default)]
    struct Counter(Cell<u64>);
    impl Charge for Counter {
        fn reserve(&self, bytes: u64) -> bool {
            self.0.set(self.0.get() + bytes);
            true
        }
        fn release(&self, bytes: u64) {
            self.0.set(self.0.get() - bytes);
        }
    }

    #[test]
    fn pages_are_charged_cached_and_released() {
        assert_eq!(region_bytes_for(1 << 20), 2 << 20);
        assert_eq!(region_bytes_for(100 << 20), 8 << 20);
        assert_eq!(region_bytes_for(1 << 40), 64 << 20);
        let mem = Counter::default();
        let a = PageArena::new(2 << 20, false);
        let pages: Vec<Page> = (0..600).map(|_| a.take(&mem).unwrap()).collect();
        assert_eq!(mem.0.get(), 600 * 4096);
        assert_eq!(a.mapped_bytes(), 4 << 20, "512 pages per 2 MiB region");
        for (i, p) in pages.iter().enumerate() {
            // SAFETY: the test owns every page it took, one thread.
            unsafe { p.bytes_mut()[7] = i as u8 };
        }
        for p in &pages[..100] {
            a.give(*p, &mem);
        }
        // The cache holds at most CACHE_MAX_PAGES; the rest was released.
        assert!(a.cached_pages() as usize <= CACHE_MAX_PAGES);
        assert_eq!(mem.0.get(), a.charged_pages() * 4096);
        assert_eq!(a.out_pages(), 500);
        let cached = a.cached_pages();
        assert_eq!(a.release_cache(&mem), cached * 4096);
        assert_eq!(mem.0.get(), 500 * 4096);
        // Released pages come back zeroed; held ones keep their bytes.
        let again = a.take(&mem).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { again.bytes()[7] }, 0);
        assert_eq!(unsafe { pages[300].bytes()[7] }, 300u16 as u8);
        assert_eq!(
            a.mapped_bytes(),
            4 << 20,
            "no new region while pages are free"
        );
    }
}

//! Rebuilding a compressed drive from the memfds a killed process kept
//! (`keep.rs` has the layout and the order of changes this relies on).
//!
//! ```text
//!  1. shadow, pages 0..size     which objects (class, id, length) and raw pages the
//!                               tables name; entries beyond the size (a shrink the
//!                               kill interrupted) are cleared
//!  2. page map                  each class's pages 0..need(n), in order; class pages
//!                               beyond need(n) are free
//!  3. arena                     regions mapped again; pages nobody holds released
//!  4. classes                   slot ids read back; unnamed slots freed (moves, as usual)
//!  5. tables                    every shadow entry set in its shard, counted
//! ```
//!
//! The cost is a read of the shadow (16 bytes a page of the drive's size,
//! twice), of the page map (8 bytes an arena page), of one id per object,
//! and the tables' inserts: measured in bench/RESULTS.md ("restart").
//! Anything that contradicts the invariants (an entry naming an object
//! no slot holds, a raw page beyond the arena, a class page missing or
//! twice) refuses the adoption: serving a wrong page would be worse than
//! the drive coming back empty.
//!
//! Adoption runs before the drive is published, so no lock is contended;
//! it changes the kept memory only by steps that are themselves kept
//! consistent (frees, cleared entries), so a kill during it is as any.

use std::sync::Arc;

use super::arena::{Charge, PageArena, PAGE_BYTES};
use super::keep::{Keep, KeepError, ID_BYTES};
use super::pool::{slot_bytes, Pool, CLASSES};
use super::shard::{locate, Shard, GROUP_PAGES, SHARDS};
use super::table::{self, Entry};

/// What the tables name, from a pass over the shadow.
struct Named {
    /// Per class, by id: the object's length (0: no entry names it).
    objects: Vec<Vec<u16>>,
    /// Raw pages, by arena index.
    raw: Vec<u64>,
}

/// The pieces of a drive rebuilt from `keep` at `size_bytes`: its arena
/// (its pages charged with `charge_over` first, past any limit: the
/// memory is there), its classes, and its shards' tables.
pub fn rebuild<C: Charge>(
    keep: Arc<Keep>,
    size_bytes: u64,
    locked: bool,
    mem: &C,
    charge_over: impl FnOnce(u64),
) -> Result<(PageArena, Pool, Vec<Shard>), KeepError> {
    let pages = size_bytes.div_ceil(PAGE_BYTES as u64);
    let carved = (keep.regions() * keep.region_bytes() / PAGE_BYTES) as u64;
    let named = named(&keep, pages, carved)?;
    let class_pages = class_pages(&keep, carved)?;
    let mut held = vec![false; carved as usize];
    for &i in &named.raw {
        held[i as usize] = true;
    }
    for &i in class_pages.iter().flatten() {
        if std::mem::replace(&mut held[i as usize], true) {
            return Err(KeepError::Inconsistent("a raw page is also a class page"));
        }
    }
    let arena = PageArena::adopt(keep.clone(), locked, |i| held[i as usize])?;
    charge_over(arena.charged_pages() * PAGE_BYTES as u64);
    let pool = Pool::default();
    for (class, idx) in class_pages.into_iter().enumerate() {
        let ps = idx
            .iter()
            .map(|&i| arena.page_at(i).expect("a carved page"));
        let n = keep.class_count(class) as usize;
        let unnamed = pool
            .adopt_class(class, ps.collect(), n, &named.objects[class])
            .map_err(KeepError::Inconsistent)?;
        for id in unnamed {
            pool.free(class, id, 0, &arena, mem);
        }
    }
    let shards = tables(&keep, pages, &arena);
    Ok((arena, pool, shards))
}

/// The shards' tables from the shadow, pages `0..pages`, on as many
/// threads as there are CPUs (each fills whole shards).
fn tables(keep: &Keep, pages: u64, arena: &PageArena) -> Vec<Shard> {
    let mut shards: Vec<Shard> = (0..SHARDS).map(Shard::new).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SHARDS));
    let mut parts: Vec<Vec<(usize, &mut Shard)>> = (0..threads).map(|_| Vec::new()).collect();
    for (si, sh) in shards.iter_mut().enumerate() {
        parts[si % threads].push((si, sh));
    }
    std::thread::scope(|scope| {
        for part in parts {
            scope.spawn(move || {
                for (si, sh) in part {
                    fill_shard(keep, pages, arena, si, sh);
                }
            });
        }
    });
    shards
}

/// Shard `si`'s entries: the page groups `g` with `g % SHARDS == si`.
fn fill_shard(keep: &Keep, pages: u64, arena: &PageArena, si: usize, sh: &mut Shard) {
    let group = GROUP_PAGES as u64;
    let mut g = si as u64;
    while g * group < pages {
        for p in g * group..((g + 1) * group).min(pages) {
            let (bits, wide) = keep.entry(p);
            if bits != 0 {
                let e =
                    table::from_kept(bits, wide, |i| arena.page_at(i)).expect("checked by `named`");
                sh.adopt_entry(locate(p).1, e);
            }
        }
        g += SHARDS as u64;
    }
}

/// The objects and raw pages the shadow names for pages `0..pages`;
/// entries beyond (up to the largest size the drive had) are cleared.
fn named(keep: &Keep, pages: u64, carved: u64) -> Result<Named, KeepError> {
    let mut n = Named {
        objects: vec![Vec::new(); CLASSES],
        raw: Vec::new(),
    };
    for p in pages..keep.max_pages() {
        if keep.entry(p).0 != 0 {
            keep.set_entry(p, 0, 0);
        }
    }
    for p in 0..pages {
        let (bits, wide) = keep.entry(p);
        if bits == 0 {
            continue;
        }
        if let Some(i) = table::kept_raw_index(bits) {
            if i >= carved {
                return Err(KeepError::Inconsistent("a raw page beyond the arena"));
            }
            n.raw.push(i);
            continue;
        }
        match table::from_kept(bits, wide, |_| None) {
            Some(Entry::Stored(o)) => {
                let class = o.class as usize;
                let fits = o.len as usize + ID_BYTES <= slot_bytes(class);
                if class >= CLASSES || o.len == 0 || !fits || o.codec > 1 {
                    return Err(KeepError::Inconsistent(
                        "an object entry of a bad class, length or codec",
                    ));
                }
                let ids = &mut n.objects[class];
                if ids.len() <= o.id as usize {
                    ids.resize(o.id as usize + 1, 0);
                }
                if std::mem::replace(&mut ids[o.id as usize], o.len) != 0 {
                    return Err(KeepError::Inconsistent("two pages name one object"));
                }
            }
            Some(Entry::Hole | Entry::Same(_) | Entry::Raw(_)) | None => {}
        }
    }
    n.raw.sort_unstable();
    if n.raw.windows(2).any(|w| w[0] == w[1]) {
        return Err(KeepError::Inconsistent("two pages name one raw page"));
    }
    Ok(n)
}

/// Each class's pages in order (arena indexes) for the objects it holds;
/// class pages beyond those are taken off the page map (free).
fn class_pages(keep: &Keep, carved: u64) -> Result<Vec<Vec<u64>>, KeepError> {
    let need: Vec<u64> = (0..CLASSES)
        .map(|c| (keep.class_count(c) * slot_bytes(c) as u64).div_ceil(PAGE_BYTES as u64))
        .collect();
    let mut found: Vec<Vec<Option<u64>>> = need.iter().map(|&k| vec![None; k as usize]).collect();
    for i in 0..carved {
        let Some(o) = keep.owner(i) else { continue };
        match found
            .get_mut(o.class)
            .and_then(|f| f.get_mut(o.index as usize))
        {
            Some(slot @ None) => *slot = Some(i),
            Some(Some(_)) => return Err(KeepError::Inconsistent("two pages are one class page")),
            None => keep.set_owner(i, None),
        }
    }
    found
        .into_iter()
        .map(|f| f.into_iter().collect::<Option<Vec<u64>>>())
        .collect::<Option<Vec<_>>>()
        .ok_or(KeepError::Inconsistent("a class page is missing"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{Algorithm, CompressedStore, KeptFiles, MemoryBudget};
    use crate::block::backend::Backend;

    const SIZE: u64 = 8 << 20;

    fn budget() -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget::new(u64::MAX))
    }

    fn files(s: &CompressedStore) -> KeptFiles {
        s.inner.arena.keep().expect("kept").files().unwrap()
    }

    /// A page of each kind a drive stores: compressible, incompressible
    /// (raw), zero, same-filled with a wide word, and text of varied size.
    fn page(kind: u64, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        match kind % 5 {
            0 => (0..4096)
                .map(|i| (i as u64 / (1 + seed % 50)) as u8)
                .collect(),
            1 => (0..4096).map(|_| rnd() as u8).collect(),
            2 => vec![0; 4096],
            3 => 0x0102_0304_0506_0708u64.to_le_bytes().repeat(512),
            _ => {
                let random = (seed % 4000) as usize;
                let mut p: Vec<u8> = (0..random).map(|_| rnd() as u8).collect();
                p.resize(4096, b'a');
                p
            }
        }
    }

    /// Writes, overwrites (other classes, same classes) and trims, the
    /// model kept beside.
    fn churn(s: &CompressedStore, model: &mut [u8], rounds: u64, seed: u64) {
        let pages = SIZE / 4096;
        for r in 0..rounds {
            let x = (seed + r).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 7;
            let p = x % pages;
            let at = (p * 4096) as usize;
            match x % 11 {
                0 => {
                    s.trim(p * 4096, 4096).unwrap();
                    model[at..at + 4096].fill(0);
                }
                1 => {
                    let d = page(x >> 20, r);
                    s.write(p * 4096 + 100, &d[..1000], false).unwrap();
                    model[at + 100..at + 1100].copy_from_slice(&d[..1000]);
                }
                _ => {
                    let d = page(x >> 20, r);
                    s.write(p * 4096, &d, false).unwrap();
                    model[at..at + 4096].copy_from_slice(&d);
                }
            }
        }
    }

    fn assert_holds(s: &CompressedStore, model: &[u8]) {
        s.check().unwrap();
        let mut back = vec![0u8; model.len()];
        s.read(0, &mut back).unwrap();
        assert!(
            back == model,
            "the adopted drive differs from what was written"
        );
    }

    #[test]
    fn a_kept_drive_is_adopted_with_every_page_and_keeps_working() {
        let s = CompressedStore::kept(SIZE, Algorithm::Lz4, None, budget(), false, false).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        churn(&s, &mut model, 6000, 1);
        let stats = s.stats();
        let f = files(&s);
        drop(s);
        let a = CompressedStore::adopt(SIZE, f, Algorithm::Lz4, None, budget(), false).unwrap();
        assert_holds(&a, &model);
        let back = a.stats();
        assert_eq!(
            (
                back.same_pages,
                back.huge_pages,
                back.compressed_pages,
                back.compr_data_bytes
            ),
            (
                stats.same_pages,
                stats.huge_pages,
                stats.compressed_pages,
                stats.compr_data_bytes
            )
        );
        assert!(back.huge_pages > 0 && back.compressed_pages > 0 && back.same_pages > 0);
        // Pages cached by the dead process are not held any more.
        assert_eq!(a.allocated_bytes(), a.inner.arena.out_pages() * 4096);
        churn(&a, &mut model, 3000, 2);
        let f = files(&a);
        drop(a);
        let b = CompressedStore::adopt(SIZE, f, Algorithm::Lz4, None, budget(), false).unwrap();
        assert_holds(&b, &model);
    }

    #[test]
    fn objects_nobody_names_and_a_move_cut_short_are_repaired() {
        let s = CompressedStore::kept(SIZE, Algorithm::Lz4, None, budget(), false, false).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        churn(&s, &mut model, 2000, 3);
        let inner = &s.inner;
        // Killed after an object was written and counted, before a page
        // named it.
        let d = vec![7u8; 600];
        inner.pool.alloc(&d, &inner.arena, &inner.mem).unwrap();
        // Killed after a free moved the class's last object into the
        // hole, before it lowered the class's count: the moved object is
        // in two slots.
        let d: Vec<u8> = (0..4096).map(|i| (i / 300) as u8).collect();
        let class =
            super::super::pool::class_for(lz4_flex::block::compress(&d).len(), true).unwrap();
        for p in 0..4 {
            s.write(p * 4096, &d, false).unwrap();
            model[(p * 4096) as usize..(p * 4096 + 4096) as usize].copy_from_slice(&d);
        }
        let keep = inner.arena.keep().unwrap();
        let n = keep.class_count(class);
        s.trim(0, 4096).unwrap();
        model[..4096].fill(0);
        assert_eq!(keep.class_count(class), n - 1);
        keep.set_class_count(class, n);
        let f = files(&s);
        drop(s);
        let a = CompressedStore::adopt(SIZE, f, Algorithm::Lz4, None, budget(), false).unwrap();
        assert_holds(&a, &model);
    }

    #[test]
    fn a_shrink_cut_short_ends_at_adoption_and_bad_memory_is_refused() {
        let zstd = Algorithm::Zstd { level: 1 };
        let s = CompressedStore::kept(SIZE, zstd, None, budget(), false, false).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        churn(&s, &mut model, 3000, 4);
        let f = files(&s);
        let held = s.allocated_bytes();
        drop(s);
        // The keeper was told the smaller size; the kill came before the
        // tail was released.
        let half = SIZE / 2 + 1000;
        let algo = Algorithm::Zstd { level: 1 };
        let a = CompressedStore::adopt(half, f, algo, None, budget(), false).unwrap();
        model.truncate(half as usize);
        let end = (half / 4096 * 4096) as usize;
        let mut tail = vec![0u8; 4096];
        tail[..(half as usize - end)].copy_from_slice(&model[end..half as usize]);
        assert_holds(&a, &model);
        assert!(a.allocated_bytes() < held);
        a.resize(SIZE).unwrap();
        let mut back = vec![0u8; 4096];
        a.read(end as u64, &mut back).unwrap();
        assert_eq!(back, tail, "nothing beyond the shrunk end comes back");
        // Not a kept drive's memory.
        let other = KeptFiles {
            arena: crate::store::memfd::create().unwrap(),
            meta: crate::store::memfd::create().unwrap(),
            ledger: None,
        };
        let e = CompressedStore::adopt(SIZE, other, algo, None, budget(), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("kept compressed"), "{e}");
    }
}

#[cfg(test)]
mod ledger_tests {
    use std::os::fd::AsFd;
    use std::sync::Arc;

    use super::super::{Algorithm, CompressedStore, KeptFiles, MemoryBudget};
    use crate::block::backend::Backend;
    use crate::store::{SyncCut, SyncStore};

    const SIZE: u64 = 4 << 20;

    fn files(s: &CompressedStore) -> KeptFiles {
        let mut f = s.inner.arena.keep().unwrap().files().unwrap();
        let ledger = s.inner.marks.ledger().unwrap().fd();
        f.ledger = Some(ledger.as_fd().try_clone_to_owned().unwrap());
        f
    }

    fn adopt(f: KeptFiles) -> CompressedStore {
        let budget = Arc::new(MemoryBudget::new(u64::MAX));
        CompressedStore::adopt(SIZE, f, Algorithm::Lz4, None, budget, false).unwrap()
    }

    /// A persistent drive's dirty set outlives the process: pages written
    /// since the last saved cut, and the pages of a cut that took them but
    /// died before it was saved (pending), are dirty after an adoption; a
    /// saved cut's are not.
    #[test]
    fn the_dirty_set_survives_an_adoption() {
        let budget = Arc::new(MemoryBudget::new(u64::MAX));
        let s = CompressedStore::kept(SIZE, Algorithm::Lz4, None, budget, false, true).unwrap();
        let page: Vec<u8> = (0..4096).map(|i| (i / 7) as u8).collect();
        for p in 0..10 {
            s.write(p * 4096, &page, false).unwrap();
        }
        // A cut that took every dirty page and died before its save.
        let mut cut = s.cut();
        while cut.next_chunk().unwrap().is_some() {}
        std::mem::forget(cut);
        assert_eq!(s.dirty_pages(), 0);
        let f = files(&s);
        drop(s);
        let a = adopt(f);
        assert_eq!(a.dirty_pages(), 10, "pending pages are dirty again");
        a.write(20 * 4096, &page, false).unwrap();
        let mut cut = a.cut();
        while cut.next_chunk().unwrap().is_some() {}
        cut.finish();
        a.write(30 * 4096, &page, false).unwrap();
        let f = files(&a);
        drop(a);
        let b = adopt(f);
        assert_eq!(
            b.dirty_pages(),
            1,
            "only the page written after the saved cut"
        );
        let mut back = vec![0u8; 4096];
        b.read(30 * 4096, &mut back).unwrap();
        assert_eq!(back, page);
    }
}

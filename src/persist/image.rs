//! The image file and its page table: the checkpoint's writes.
//!
//! The image holds the drive's bytes at their drive offsets, so a plain
//! drive's image is a raw disk image (qemu-img, losetup). Pages that read as
//! zero are holes (punched), so the image stays sparse. The `pages` table
//! holds one entry per page (see `format.rs`): the checksum or the nonce and
//! tag that restore verifies. Image and table change only during a
//! checkpoint, i.e. only by replaying committed journal records, so a crash
//! in the middle is repaired by replaying them again.

use std::io;

use super::format::{PAGE_BYTES, RECORD_HEADER_BYTES};
use super::storage::StorageFile;

/// A drive's image and page table.
pub struct Image<F: StorageFile> {
    /// The drive's bytes.
    pub image: F,
    /// One entry per page.
    pub pages: F,
    /// Bytes per entry.
    pub entry_bytes: usize,
    /// Pages are ciphertext: the image keeps whole pages (a partial last
    /// page is still 4 KiB of ciphertext), so its length is rounded up.
    pub encrypted: bool,
}

/// Length of the image file of a drive of `drive_size` bytes.
pub fn image_len(drive_size: u64, encrypted: bool) -> u64 {
    if encrypted {
        drive_size.next_multiple_of(PAGE_BYTES as u64)
    } else {
        drive_size
    }
}

impl<F: StorageFile> Image<F> {
    /// Writes a run of data pages (clipped to `drive_size`) and their entries.
    pub fn write_data(
        &self,
        first_page: u64,
        drive_size: u64,
        data: &[u8],
        entries: &[u8],
    ) -> io::Result<()> {
        let start = first_page * PAGE_BYTES as u64;
        let end = (start + data.len() as u64).min(image_len(drive_size, self.encrypted));
        if start < end {
            self.image
                .write_at(&data[..(end - start) as usize], start)?;
            if end - start >= 256 << 10 {
                // Let the disk write it while the next run is read back.
                self.image.start_writeback(start, end - start);
            }
        }
        self.pages
            .write_at(entries, first_page * self.entry_bytes as u64)
    }

    /// Makes a run of pages holes (clipped to `drive_size`), with hole entries.
    pub fn write_zero(&self, first_page: u64, n: u64, drive_size: u64) -> io::Result<()> {
        let start = first_page * PAGE_BYTES as u64;
        let end = ((first_page + n) * PAGE_BYTES as u64).min(image_len(drive_size, self.encrypted));
        if start < end {
            self.image.punch_hole(start, end - start)?;
        }
        let zeroes = [0u8; 64 * RECORD_HEADER_BYTES];
        let mut at = first_page * self.entry_bytes as u64;
        let stop = (first_page + n) * self.entry_bytes as u64;
        while at < stop {
            let k = (stop - at).min(zeroes.len() as u64) as usize;
            self.pages.write_at(&zeroes[..k], at)?;
            at += k as u64;
        }
        Ok(())
    }

    /// Sets the image to `drive_size` bytes and the table to match.
    pub fn set_size(&self, drive_size: u64) -> io::Result<()> {
        self.image.set_len(image_len(drive_size, self.encrypted))?;
        let pages = drive_size.div_ceil(PAGE_BYTES as u64);
        self.pages.set_len(pages * self.entry_bytes as u64)
    }

    /// Makes the image and the table durable.
    pub fn sync(&self) -> io::Result<()> {
        self.image.sync_data()?;
        self.pages.sync_data()
    }
}

//! Per-page compression time and slab-model ratio of lz4_flex and zstd levels
//! (with and without a trained dictionary) on the corpus, one thread.
use std::io::Read;
use std::time::Instant;
use zstd::zstd_safe::CParameter;
const PAGE: usize = 4096;
fn slab(len: usize) -> usize { if len > 3072 { PAGE } else { len.div_ceil(128) * 128 } }
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let mut data = Vec::new();
    std::fs::File::open(&path).unwrap().read_to_end(&mut data).unwrap();
    let pages: Vec<&[u8]> = data.chunks_exact(PAGE).filter(|p| p[8..] != p[..PAGE - 8]).collect();
    let n = pages.len();
    let total = data.len() as f64;
    let mut buf = [0u8; 8192];
    let t = Instant::now();
    let mut mem = 0usize;
    for p in &pages { mem += slab(lz4_flex::block::compress_into(p, &mut buf).unwrap()); }
    let dt = t.elapsed().as_secs_f64();
    println!("lz4_flex: {:.2} us/page, slab-model ratio {:.3}", dt * 1e6 / n as f64, total / mem as f64);
    // dictionary trained on every 100th page
    let samples: Vec<&[u8]> = pages.iter().step_by(100).copied().collect();
    let dict = zstd::dict::from_samples(&samples, 64 << 10).unwrap();
    for level in [-3, -1, 1, 3] {
        for use_dict in [false, true] {
            let mut c = if use_dict { zstd::bulk::Compressor::with_dictionary(level, &dict).unwrap() } else { zstd::bulk::Compressor::new(level).unwrap() };
            c.set_parameter(CParameter::ContentSizeFlag(false)).unwrap();
            c.set_parameter(CParameter::ChecksumFlag(false)).unwrap();
            c.set_parameter(CParameter::DictIdFlag(false)).unwrap();
            let t = Instant::now();
            let mut mem = 0usize;
            for p in &pages { mem += slab(c.compress_to_buffer(p, &mut buf[..]).unwrap()); }
            let dt = t.elapsed().as_secs_f64();
            println!("zstd:{level}{}: {:.2} us/page, slab-model ratio {:.3}", if use_dict { " +64K dict" } else { "" }, dt * 1e6 / n as f64, total / mem as f64);
        }
    }
}

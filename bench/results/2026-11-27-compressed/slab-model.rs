//! Models the slab cost of a corpus under ramd's compressed store and
//! variants (class step, huge threshold, block size), page by page.
use std::io::Read;

const PAGE: usize = 4096;

/// Memory per object of `len` bytes under (step, huge_max, max_block_pages).
fn cost(len: usize, step: usize, huge_max: usize, max_block_pages: usize) -> f64 {
    if len > huge_max {
        return PAGE as f64;
    }
    let slot = len.div_ceil(step) * step;
    let mut pages = 1;
    while pages < max_block_pages {
        let b = pages * PAGE;
        if b % slot <= b / 32 {
            break;
        }
        pages += 1;
    }
    let b = pages * PAGE;
    b as f64 / (b / slot) as f64
}

fn main() {
    let path = std::env::args().nth(1).expect("corpus file");
    let mut data = Vec::new();
    std::fs::File::open(&path).unwrap().read_to_end(&mut data).unwrap();
    let pages = data.len() / PAGE;
    let mut lz = Vec::with_capacity(pages);
    let mut zs = Vec::with_capacity(pages);
    let mut same = 0usize;
    let mut c = zstd::bulk::Compressor::new(3).unwrap();
    use zstd::zstd_safe::CParameter;
    c.set_parameter(CParameter::ContentSizeFlag(false)).unwrap();
    c.set_parameter(CParameter::ChecksumFlag(false)).unwrap();
    c.set_parameter(CParameter::DictIdFlag(false)).unwrap();
    let mut buf = [0u8; 8192];
    for p in data.chunks_exact(PAGE) {
        if p[8..] == p[..PAGE - 8] {
            same += 1;
            continue;
        }
        lz.push(lz4_flex::block::compress_into(p, &mut buf).unwrap());
        zs.push(c.compress_to_buffer(p, &mut buf[..]).unwrap());
    }
    let total = data.len() as f64;
    println!("pages {pages}, same-filled {same}, stored {}", lz.len());
    for (name, v) in [("lz4_flex", &lz), ("zstd:3", &zs)] {
        // zram-like: compr_data_size with huge at >= T (count T giving zram's huge pages)
        for t in [3072usize, 3264, 3400, 3632, 3700, 3800, 4096] {
            let huge = v.iter().filter(|&&n| n >= t).count();
            let compr: usize = v.iter().map(|&n| if n >= t { PAGE } else { n }).sum();
            println!("{name}: huge if >= {t}: huge {huge}, compr {compr}");
        }
        for (step, huge_max, mbp) in [
            (128, 3072, 8), (128, 3584, 8), (128, 3968, 8), (64, 3072, 8), (64, 3584, 8),
            (32, 3072, 8), (32, 3584, 8), (32, 3968, 8), (16, 3584, 8), (32, 3584, 16), (16, 3632, 16),
        ] {
            let mem: f64 = v.iter().map(|&n| cost(n, step, huge_max, mbp)).sum();
            println!(
                "{name}: step {step:>3} huge > {huge_max} block <= {mbp} pages: slab {:.1} MiB, ratio {:.3}",
                mem / 1048576.0,
                total / mem
            );
        }
    }
}

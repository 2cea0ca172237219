//! Padding-free packing (`--packing`): several training examples share one row of a batch, each attending only
//! to itself, with positions that restart at every example. Rows are filled once per run by best-fit decreasing
//! (TRL's `bfd` strategy: longest example first, each into the fullest row it still fits), so a pack is a fixed
//! list of examples and the batch plan shuffles packs the way it shuffles examples unpacked.
//!
//! A packed [`Batch`] carries `row_starts`: for every token, where its own example begins in the row. The model
//! turns it into per-token rotary positions (`j - row_starts[j]`) and an attention that sees no key before it;
//! the first token of every example predicts nothing, as position 0 does in an unpacked row.

use super::batches::{place_example, Batch};
use super::tokenize::Example;
use crate::engine::{Error, Result};
use std::collections::BTreeMap;

/// Example indices of each pack, in the order they sit in the row, for examples of `lengths` tokens in rows of
/// at most `capacity` tokens (an example longer than that gets a row of its own). Deterministic: equal lengths
/// keep their index order.
pub fn pack_examples(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut packs: Vec<(usize, Vec<usize>)> = Vec::new();
    // Room left -> the packs with exactly that room, oldest first.
    let mut by_room: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in order {
        let need = lengths[i];
        let fullest = by_room.range(need..).next().map(|(&room, _)| room);
        let pack = match fullest {
            Some(room) => {
                let ids = by_room.get_mut(&room).expect("the room was just found");
                let pack = ids.remove(0);
                if ids.is_empty() {
                    by_room.remove(&room);
                }
                pack
            }
            None => {
                packs.push((0, Vec::new()));
                packs.len() - 1
            }
        };
        packs[pack].0 += need;
        packs[pack].1.push(i);
        let room = capacity.saturating_sub(packs[pack].0);
        if room > 0 {
            by_room.entry(room).or_default().push(pack);
        }
    }
    packs.into_iter().map(|(_, ids)| ids).collect()
}

/// Tokens in each pack.
pub fn pack_lengths(packs: &[Vec<usize>], lengths: &[usize]) -> Vec<usize> {
    packs.iter().map(|p| p.iter().map(|&i| lengths[i]).sum()).collect()
}

/// The packs at `pack_indices` as one batch: each pack's examples end to end in one row, right-padded with
/// `pad_id` to the longest pack; `row_starts` says where each token's example begins (padding is a span of its
/// own, never a target).
pub fn collate_packs(examples: &[Example], packs: &[Vec<usize>], pack_indices: &[usize], pad_id: u32) -> Result<Batch> {
    if pack_indices.is_empty() {
        return Err(Error::Data("cannot build an empty batch".into()));
    }
    let rows: Vec<Vec<&Example>> = pack_indices
        .iter()
        .map(|&p| {
            let pack = packs
                .get(p)
                .ok_or_else(|| Error::Data(format!("batch refers to pack {p} but there are only {}", packs.len())))?;
            pack.iter()
                .map(|&i| {
                    examples.get(i).ok_or_else(|| {
                        Error::Data(format!("pack {p} refers to example {i} but there are only {}", examples.len()))
                    })
                })
                .collect()
        })
        .collect::<Result<_>>()?;
    let lengths: Vec<usize> = rows.iter().map(|r| r.iter().map(|e| e.len()).sum()).collect();
    let seq_len = lengths.iter().copied().max().unwrap_or(0);
    let mut input_ids = vec![pad_id; rows.len() * seq_len];
    let mut target_mask = vec![0.0f32; rows.len() * seq_len];
    let mut row_starts = vec![0u32; rows.len() * seq_len];
    let mut target_tokens = 0;
    for (r, row) in rows.iter().enumerate() {
        let base = r * seq_len;
        let mut at = 0;
        for example in row {
            target_tokens += place_example(example, base + at, &mut input_ids, &mut target_mask);
            row_starts[base + at..base + at + example.len()].fill(at as u32);
            at += example.len();
        }
        row_starts[base + at..base + seq_len].fill(at as u32);
    }
    Ok(Batch {
        input_ids,
        target_mask,
        batch_size: rows.len(),
        seq_len,
        target_tokens,
        lengths,
        row_starts: Some(row_starts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(ids: &[u32]) -> Example {
        Example { input_ids: ids.to_vec(), target_mask: vec![true; ids.len()], truncated: false }
    }

    #[test]
    fn best_fit_decreasing_fills_the_fullest_row_that_fits() {
        // 7 and 3 fill one row of 10; 6 then takes the row that 4 fits best; 5 and 5 another.
        let lengths = [3, 7, 6, 5, 4, 5];
        let packs = pack_examples(&lengths, 10);
        assert_eq!(packs, vec![vec![1, 0], vec![2, 4], vec![3, 5]]);
        assert_eq!(pack_lengths(&packs, &lengths), vec![10, 10, 10]);
        let mut all: Vec<usize> = packs.concat();
        all.sort_unstable();
        assert_eq!(all, (0..6).collect::<Vec<_>>(), "every example exactly once");
        assert_eq!(pack_examples(&[12, 2], 10), vec![vec![0], vec![1]], "a row too long sits alone");
    }

    #[test]
    fn collated_packs_restart_positions_and_never_target_across_examples() {
        let examples = vec![example(&[1, 2, 3]), example(&[4, 5]), example(&[6, 7, 8, 9])];
        let packs = vec![vec![0, 1], vec![2]];
        let batch = collate_packs(&examples, &packs, &[0, 1], 0).unwrap();
        assert_eq!((batch.batch_size, batch.seq_len), (2, 5));
        assert_eq!(batch.input_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
        assert_eq!(batch.target_mask, vec![0., 1., 1., 0., 1., 0., 1., 1., 1., 0.]);
        assert_eq!(batch.target_tokens, 6);
        assert_eq!(batch.lengths, vec![5, 4]);
        let starts = batch.row_starts.clone().unwrap();
        assert_eq!(starts, vec![0, 0, 0, 3, 3, 0, 0, 0, 0, 4]);
        assert!(collate_packs(&examples, &packs, &[2], 0).unwrap_err().to_string().contains("pack 2"));
    }
}

//! The rank recommendation: the largest energy rank 90 over the adapted modules, rounded up to a power of two,
//! and the reason in words (which module needs it, and what that says about the rank trained at).

use super::ModuleXray;
use super::XraySummary;

/// The recommendation for an adapter of rank `trained_rank` whose modules are `modules`.
pub fn recommend(modules: &[ModuleXray], trained_rank: usize) -> XraySummary {
    let widest = modules
        .iter()
        .max_by(|a, b| a.energy_rank_90.cmp(&b.energy_rank_90).then(b.update_norm.total_cmp(&a.update_norm).reverse()));
    let Some(widest) = widest.filter(|m| m.energy_rank_90 > 0) else {
        return XraySummary {
            recommended_rank: None,
            reason: "every update is zero (an untrained adapter: LoRA's B starts at zero), so there is nothing to \
                     measure yet"
                .into(),
        };
    };
    let needed = widest.energy_rank_90;
    let recommended = needed.next_power_of_two();
    let why = format!(
        "{} holds 90% of its update in {needed} of {trained_rank} directions, the most of any of the {} modules \
         (energy rank 90 = {needed}); rounded up to a power of two: rank {recommended}",
        widest.name,
        modules.len()
    );
    let verdict = if needed >= trained_rank {
        format!(
            ". It uses every direction rank {trained_rank} gives it: the rank may be too small rather than too \
             large; try a larger one."
        )
    } else if recommended < trained_rank {
        format!(". Rank {trained_rank} leaves directions that hold little of any update: rank {recommended} should do.")
    } else {
        format!(". Rank {trained_rank} is about right.")
    };
    XraySummary { recommended_rank: Some(recommended), reason: why + &verdict }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(layer: usize, name: &str, rank90: usize, norm: f64) -> ModuleXray {
        ModuleXray {
            name: format!("model.layers.{layer}.self_attn.{name}"),
            layer,
            module: name.into(),
            singular_values: vec![],
            update_norm: norm,
            relative_norm: None,
            energy_rank_50: 1,
            energy_rank_90: rank90,
            energy_rank_99: rank90,
            magnitude_change: None,
        }
    }

    #[test]
    fn the_widest_module_decides_and_is_named() {
        let s = recommend(&[module(0, "q_proj", 3, 1.0), module(1, "v_proj", 5, 0.5)], 16);
        assert_eq!(s.recommended_rank, Some(8));
        assert!(s.reason.contains("model.layers.1.self_attn.v_proj") && s.reason.contains("rank 8"), "{}", s.reason);
        let full = recommend(&[module(0, "q_proj", 4, 1.0)], 4);
        assert_eq!(full.recommended_rank, Some(4));
        assert!(full.reason.contains("try a larger one"), "{}", full.reason);
        let zero = recommend(&[module(0, "q_proj", 0, 0.0)], 4);
        assert_eq!(zero.recommended_rank, None);
    }
}

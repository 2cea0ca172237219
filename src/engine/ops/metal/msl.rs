//! WGSL -> Metal Shading Language through naga (the translator wgpu itself uses on macOS): parse, validate, and
//! write MSL with binding N of group 0 at `[[buffer(N)]]`, so the Metal glue binds buffers at the indices the
//! WGSL names. The Mac translates at first use (a few milliseconds per kernel, cached by the glue) rather than
//! in a build script: no build-time naga on every host, no generated file to drift from its WGSL, and this exact
//! function runs in CI on Linux (tests/wgsl_kernels.rs includes this file), so what CI checks is what the Mac
//! compiles. Depends on naga and std only, for that reason.

use naga::back::msl;
use naga::valid::{Capabilities, ValidationFlags, Validator};

/// The Metal Shading Language version we emit and compile with: MSL 2.4, macOS 12 (Monterey) and later, which
/// every Apple Silicon Mac can run. Nothing in the kernels needs Metal 3 (they store bf16 as u32 words, not
/// Metal's `bfloat`).
pub const MSL_VERSION: (u8, u8) = (2, 4);

/// The highest binding number any kernel uses (bindings 0..=MAX_BINDING are mapped to buffer slots).
const MAX_BINDING: u32 = 15;

/// The buffer slot of naga's `_mslBufferSizes` (one u32 byte size per runtime-sized storage array of the module,
/// in declaration order, see [`Msl::sized_bindings`]); the kernels never read it (no `arrayLength`, unchecked
/// indexing) but every entry point that touches a runtime-sized array takes it. 30 is Metal's last buffer slot.
pub const BUFFER_SIZES_SLOT: u8 = 30;

/// A translated module.
#[derive(Debug, Clone)]
pub struct Msl {
    /// The MSL source.
    pub source: String,
    /// `(wgsl_name, msl_name)` of each entry point (naga renames names that collide with MSL keywords).
    pub entry_points: Vec<(String, String)>,
    /// The bindings of the module's runtime-sized storage arrays in declaration order: the layout of the u32
    /// array bound at [`BUFFER_SIZES_SLOT`] (0 for a binding the entry point does not use).
    pub sized_bindings: Vec<u32>,
}

impl Msl {
    /// The MSL function name of the WGSL entry point `wgsl_name`.
    pub fn function(&self, wgsl_name: &str) -> Option<&str> {
        self.entry_points.iter().find(|(w, _)| w == wgsl_name).map(|(_, m)| m.as_str())
    }
}

/// Parses and validates `wgsl` (f16 allowed), returning the module and its validation info.
pub fn validate(wgsl: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module =
        naga::front::wgsl::parse_str(wgsl).map_err(|e| format!("WGSL parse error: {}", e.emit_to_string(wgsl)))?;
    let caps = Capabilities::SHADER_FLOAT16;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("WGSL validation error: {}", e.emit_to_string(wgsl)))?;
    Ok((module, info))
}

/// Translates `wgsl` to MSL [`MSL_VERSION`] with every entry point's bindings at `[[buffer(binding)]]`.
pub fn translate(wgsl: &str) -> Result<Msl, String> {
    let (module, info) = validate(wgsl)?;
    let mut resources = msl::BindingMap::default();
    for binding in 0..=MAX_BINDING {
        let target = msl::BindTarget { buffer: Some(binding as u8), mutable: true, ..Default::default() };
        resources.insert(naga::ResourceBinding { group: 0, binding }, target);
    }
    let per_entry_point_map = module
        .entry_points
        .iter()
        .map(|ep| {
            let res = msl::EntryPointResources {
                resources: resources.clone(),
                sizes_buffer: Some(BUFFER_SIZES_SLOT),
                ..Default::default()
            };
            (ep.name.clone(), res)
        })
        .collect();
    let options = msl::Options {
        lang_version: MSL_VERSION,
        per_entry_point_map,
        fake_missing_bindings: false,
        // Unchecked (the default): every index in the kernels is bounded by the launch shape; a check would cost
        // a compare per load.
        bounds_check_policies: naga::proc::BoundsCheckPolicies::default(),
        zero_initialize_workgroup_memory: false,
        force_loop_bounding: false,
        emit_int_div_checks: false,
        ..Default::default()
    };
    let (source, tinfo) = msl::write_string(&module, &info, &options, &msl::PipelineOptions::default())
        .map_err(|e| format!("MSL translation error: {e}"))?;
    let mut entry_points = Vec::new();
    for (ep, name) in module.entry_points.iter().zip(tinfo.entry_point_names) {
        let name = name.map_err(|e| format!("MSL translation of entry point {}: {e}", ep.name))?;
        entry_points.push((ep.name.clone(), name));
    }
    let sized_bindings = module
        .global_variables
        .iter()
        .filter(|(_, var)| module.types[var.ty].inner.needs_host_buffer_byte_size(&module.types))
        .filter_map(|(_, var)| var.binding.as_ref().map(|b| b.binding))
        .collect();
    Ok(Msl { source, entry_points, sized_bindings })
}

// All the C++ kernels as one extension, compiled as one unit. torch/extension.h and the
// pybind11 module code cost about 20 s of compiling per unit, more than any kernel source:
// one unit builds in about half the time three separate extensions took, and a fresh
// environment (each CI run, each worker installing picasso) pays it once.
//
// Each source keeps its own namespace and registers its functions in a submodule of its
// own name: cpu.py reaches them as _kernels.packed_embedding.lookup and so on.

#include "packed_embedding.cpp"
#include "hot_cache.cpp"
#include "id_map.cpp"
#include "key_index.cpp"
#include "decode_ids.cpp"
#include "pack_groups.cpp"
#include "cross_ids.cpp"
#include "decode_pack.cpp"  // after decode_ids.cpp and pack_groups.cpp, whose ops it calls

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  picasso_kernels::packed_embedding::register_ops(m.def_submodule("packed_embedding"));
  picasso_kernels::hot_cache::register_ops(m.def_submodule("hot_cache"));
  picasso_kernels::id_map::register_ops(m.def_submodule("id_map"));
  picasso_kernels::key_index::register_ops(m.def_submodule("key_index"));
  picasso_kernels::decode_ids::register_ops(m.def_submodule("decode_ids"));
  picasso_kernels::pack_groups::register_ops(m.def_submodule("pack_groups"));
  picasso_kernels::cross_ids::register_ops(m.def_submodule("cross_ids"));
  picasso_kernels::decode_pack::register_ops(m.def_submodule("decode_pack"));
}

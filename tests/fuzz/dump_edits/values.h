// The values fuzz_dump's edits draw from (dump_edits/builder.h): numbers near every edge a reader checks, strings
// a dump holds, the attribute and object names it uses, the keys of its model and run options.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>

namespace fuzz_dump {

inline constexpr int64_t kInts[] = {0,
                         1,
                         -1,
                         2,
                         3,
                         4,
                         7,
                         8,
                         16,
                         31,
                         32,
                         63,
                         64,
                         65,
                         127,
                         128,
                         255,
                         1000,
                         1001,
                         1024,
                         1025,
                         4096,
                         4097,
                         65536,
                         int64_t{1} << 20,
                         int64_t{1} << 22,
                         (int64_t{1} << 22) + 1,
                         int64_t{1} << 30,
                         (int64_t{1} << 30) + 1,
                         std::numeric_limits<int32_t>::max(),
                         int64_t{std::numeric_limits<int32_t>::max()} + 1,
                         std::numeric_limits<int32_t>::min(),
                         int64_t{std::numeric_limits<int32_t>::min()} - 1,
                         std::numeric_limits<uint32_t>::max(),
                         int64_t{1} << 40,
                         (int64_t{1} << 40) + 1,
                         int64_t{1} << 53,
                         std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min(),
                         -2,
                         -64};

inline constexpr double kDoubles[] = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           2.5,
                           3.0,
                           1e308,
                           -1e308,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::denorm_min(),
                           9.3e18,
                           1.8446744073709552e19,
                           4294967296.0,
                           2147483648.0,
                           1e-300,
                           4096.0,
                           1e20};

inline constexpr const char* kStrings[] = {"",
                                "complete",
                                "stopped: after layer 0 probe x rank 0",
                                "stopped",
                                "running: x",
                                "mla-bisect-dump",
                                "mla-bisect-dump ",
                                "fp32",
                                "bf16",
                                "fp16",
                                "fp8_e4m3",
                                "fp8_e5m2",
                                "fp32|bf16",
                                "|",
                                "replicated",
                                "heads",
                                "partial",
                                "rows",
                                "columns",
                                "stats",
                                "sketch",
                                "full",
                                "prefill",
                                "decode",
                                "chunked",
                                "mha",
                                "absorbed",
                                "null",
                                "{}",
                                "[]",
                                "[\"layer 0 stage rope\"]",
                                "[1]",
                                "{\"a\":",
                                "reference",
                                "\xff\xfe",
                                "rank0",
                                "layer0"};

inline constexpr const char* kRootAttrs[] = {"format", "schema_version", "tool_version", "git_sha", "created_utc",
    "engine", "engine_options", "engine_dtype", "device", "model", "run_options", "tp", "mode", "seed", "inject",
    "probe_level", "command", "process_rank", "processes", "launch_id", "layer_index", "status", "last_stage",
    "kv_cache_dtype", "kv_cache_scale"};
inline constexpr const char* kProbeAttrs[] = {"order", "stage", "contract", "shape", "heads_axis", "rope_from",
    "engine_dtype"};
inline constexpr const char* kRankAttrs[] = {"l2", "absmax", "mean", "std", "nan", "inf", "checksum", "level", "shape",
    "dtype"};
inline constexpr const char* kJsonAttrs[] = {"model", "run_options", "last_stage"};
inline constexpr const char* kStringAttrs[] = {"format", "tool_version", "git_sha", "created_utc", "engine",
    "engine_options", "engine_dtype", "device", "mode", "inject", "probe_level", "command", "launch_id", "status",
    "stage", "contract", "level", "dtype", "kv_cache_dtype"};
inline constexpr const char* kShapeAttrs[] = {"shape"};

inline constexpr const char* kObjectNames[] = {"inputs", "weights", "layer0", "layer1", "layer2", "layer3", "layer00",
    "layer-1", "layer", "layer4294967296", "layer999999999", "x", "positions", "seq_lens", "context_lens",
    "block_table", "kv_cache", "index_cache", "rank0", "rank1", "rank2", "rank3", "rank00", "rank", "rank-1",
    "rank4096", "rank999999", "rank9999999", "token_l2", "head_l2", "sketch", "data", "extra"};

inline constexpr const char* kModelKeys[] = {"hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_hidden_layers", "rope_theta", "rms_norm_eps",
    "rope_interleave", "rope_scaling", "rope_parameters", "index_topk", "index_n_heads", "index_head_dim", "model_type",
    "name", "text_config", "index_shared", "indexer_types"};
inline constexpr const char* kRunKeys[] = {"mode", "form", "tp", "layers", "tokens", "batch", "context", "seed",
    "position_offset", "input_norm", "keys", "setup", "kv_cache_dtype", "kv_cache_scale"};

template <class T, size_t N> constexpr size_t count_of(const T (&)[N]) { return N; }

}  // namespace fuzz_dump

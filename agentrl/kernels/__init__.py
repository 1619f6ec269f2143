"""Compute paths shared by agents/ (generation, scoring) and trainers/ (the update, the critic): the CPU's
bf16 probe and precision choice (`precision`), linear weights packed for oneDNN (`packed`), the CPU
attention with packed query heads (`attention`), the shared-prefix KV cache (`kvcache`), equal forward
counts on sharded engines (`syncforward`) and FLOP counting (`flops`); which CPU fast paths run
(`features`: `AGENTRL_CPU_FEATURES`)."""

"""The teacher: a Pangu (openPangu-Embedded) decoder, which also runs Llama, Qwen2 and SmolLM2 checkpoints.

openPangu-Embedded is Llama with a bias on q, k, v and o; Qwen2 has the bias on q, k, v only; Llama and
SmolLM2 have none. ``TeacherConfig.qkv_bias`` / ``o_bias`` select the variant, so one Cell serves all four.

State is explicit: ``construct`` receives the token ids, their positions, the additive attention mask over
the whole static cache and the cache rows to write. It never decides what a token may see; the caller
(greedy loop or tree verifier) does, through the mask. It returns the logits of every input token and the
EAGLE-3 features: the hidden states entering layers ``cfg.aux_layer_ids`` concatenated low|mid|high.
"""

from __future__ import annotations

from mindspore import Tensor, nn, ops

from ..compute import ComputeChoice
from ..teacher_config import TeacherConfig
from ..kernels import DecoderLayerKernel, DecoderStackKernel, LinearKernel, fused_layer_supported
from ..kernels.greedy_head import GreedyQ8HeadKernel, HeadNotServed
from ..kernels.greedy_head import fast_here as greedy_head_fast
from .layers import CachedAttention, Embedding, Linear, RMSNorm, SwiGLU, rope_tables, write_index


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: TeacherConfig, batch_size: int, max_len: int, compute: ComputeChoice):
        super().__init__()
        matmul = compute.matmul
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = CachedAttention(cfg, batch_size, max_len, compute)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, matmul, cfg.rms_norm_eps)
        # fused CPU path: the sub-cells' five kernels as one op (they hold the packed weights it reads)
        self.fused = (self.self_attn.fused and self.mlp.fused
                      and fused_layer_supported(cfg.hidden_size, cfg.intermediate_size, cfg.head_dim))
        if self.fused:
            self.kernel = DecoderLayerKernel(matmul.dtype, cfg.qkv_bias, cfg.o_bias, cfg.rms_norm_eps)

    def construct(self, x, cos, sin, mask, write_idx):
        if self.fused:
            a, m = self.self_attn, self.mlp
            qkv_bias = ops.concat((a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)) if a.qkv_bias else None
            return self.kernel(x, self.input_layernorm.weight, a.qkv_kernel.packed_weight, qkv_bias, cos, sin, mask,
                               write_idx, a.k_cache, a.v_cache, a.o_kernel.packed_weight,
                               a.o_proj.bias if a.o_bias else None, self.post_attention_layernorm.weight,
                               m.gate_up_kernel.packed_weight, m.down_kernel.packed_weight)
        # x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)); the sub-cells take the norm and
        # the residual (inside their kernels when they are fused)
        x = self.self_attn(x, cos, sin, mask, write_idx, self.input_layernorm.weight, x)
        return self.mlp(x, self.post_attention_layernorm.weight, x)

    def stack_args(self):
        """A fused layer's inputs to ``DecoderStackKernel`` (its weights and caches, in the stack's order)."""
        a, m = self.self_attn, self.mlp
        args = (self.input_layernorm.weight, a.qkv_kernel.packed_weight)
        if a.qkv_bias:
            args = args + (ops.concat((a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)),)
        args = args + (a.k_cache, a.v_cache, a.o_kernel.packed_weight)
        if a.o_bias:
            args = args + (a.o_proj.bias,)
        return args + (self.post_attention_layernorm.weight, m.gate_up_kernel.packed_weight,
                       m.down_kernel.packed_weight)


class PanguModel(nn.Cell):
    def __init__(self, cfg: TeacherConfig, batch_size: int, max_len: int, compute: ComputeChoice):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.CellList([DecoderLayer(cfg, batch_size, max_len, compute)
                                   for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class PanguForCausalLM(nn.Cell):
    """Teacher Cell. ``construct(input_ids, positions, mask, cache_rows) -> (logits, aux_hidden)``.

    Shapes: ``input_ids, positions, cache_rows [B, T]`` int32; ``mask [B, 1, T, W]`` float32 additive over cache
    rows ``[0, W)`` (see ``mindspore_eagle.tree.mask``): ``W = max_len``, or on the primitive attention path a
    context bucket ``W < max_len`` holding every row the forward writes or sees (``CachedAttention``; the fused
    kernels, ``fused_attention``, take ``W = max_len`` only); ``logits [B, T, vocab]``;
    ``aux_hidden [B, T, 3 * hidden]``.
    Positions index the rotary table; ``cache_rows`` say where each token's K/V is written. They usually
    coincide for a chain, and differ inside a tree (a node at depth d has position L + d but row L + i).
    ``logit_rows`` (optional int32 ``[B, T]``): the rows whose logits the caller reads; with a custom LM head (tied,
    or untied without a bias) only those are computed (the others are NaN: a prompt chunk's rows, padding),
    elsewhere every row is. ~20% of a forward is the LM head (49,152 x 576 for the default teacher), so a 64-row
    prompt chunk that needs one row's logits, or none, skips most of that.
    ``compute`` (``compute.ComputeChoice``) picks the attention core of every layer, every Linear's matmul and the
    tied LM head's, and so whether the layers take the fused CPU kernels (default: primitives and MindSpore's
    MatMul); custom kernels are filled by ``kernels.pack_weights`` after the weights are loaded.
    """

    def __init__(self, cfg: TeacherConfig, batch_size: int = 1, max_len: int = 1024,
                 compute: ComputeChoice = ComputeChoice()):
        super().__init__()
        matmul = compute.matmul
        self.cfg = cfg
        self.batch_size = batch_size
        self.max_len = max_len
        self.fused_attention = compute.fused_layers(cfg.head_dim)  # every layer's, alike
        self.model = PanguModel(cfg, batch_size, max_len, compute)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, matmul=matmul)
        self.tied = cfg.tie_word_embeddings
        self.logits_matmul = ops.MatMul(transpose_b=True)
        self.tied_custom = self.tied and matmul.custom
        # an untied custom head without a bias computes only the rows asked for, too (logit_rows)
        self.untied_rows = not self.tied and self.lm_head.custom and not self.lm_head.has_bias
        if self.tied_custom:  # logits = norm(x) @ embed_tokens.weight^T on a packed copy of the table, norm inside
            self.tied_kernel = LinearKernel(cfg.hidden_size, cfg.vocab_size, matmul.dtype, transposed=True,
                                            norm_eps=cfg.rms_norm_eps)
        n_pos = max(cfg.max_position_embeddings, max_len)
        cos, sin = rope_tables(cfg, n_pos)
        self.cos_table = Tensor(cos)  # [P, D] constants, gathered by position
        self.sin_table = Tensor(sin)
        self.aux_ids = tuple(cfg.aux_layer_ids)
        self.num_kv_heads = cfg.num_kv_heads
        # every layer fused (they are alike): the whole stack, embedding and RoPE rows included, runs as one op
        self.stacked = all(layer.fused for layer in self.model.layers) and len(self.aux_ids) > 0
        # the greedy token without the logits (kernels.greedy_head), set by after_pack where it is fast: a native Q8
        # or dense LM head without bias on a SIMD kernel path
        self.greedy_head_ready = False
        if self.stacked:
            self.stack = DecoderStackKernel(matmul.dtype, cfg.qkv_bias, cfg.o_bias, cfg.rms_norm_eps, self.aux_ids)

    def construct(self, input_ids, positions, mask, cache_rows, logit_rows=None):
        b, t = input_ids.shape
        x, aux = self.hidden(input_ids, positions, mask, cache_rows)
        if self.tied_custom:  # [B, T, vocab] straight from the kernel (a reshape of its output would be a copy)
            return self.tied_kernel(x, None, self.model.norm.weight, None, logit_rows), aux
        if self.untied_rows and logit_rows is not None:
            return self.lm_head.kernel(self.model.norm(x), None, None, None, logit_rows), aux
        h2 = self.model.norm(x).reshape(b * t, -1)
        if self.tied:
            logits = self.logits_matmul(h2, self.model.embed_tokens.weight)
        else:
            logits = self.lm_head(h2)
        logits = logits.reshape(b, t, -1)
        return logits, aux

    def hidden(self, input_ids, positions, mask, cache_rows):
        """The decoder stack: ``(hidden after the last layer [B, T, H], aux [B, T, A H])``, before the final norm."""
        if self.stacked:
            args = ()
            for layer in self.model.layers:
                args = args + layer.stack_args()
            return self.stack(input_ids, positions, cache_rows, mask, self.model.embed_tokens.weight, self.cos_table,
                              self.sin_table, args)
        return self.layers_one_by_one(input_ids, positions, mask, cache_rows)

    def greedy(self, input_ids, positions, mask, cache_rows, logit_rows=None):
        """``(token int32 [B, T], aux)``: each row's ``np.argmax`` of the logits ``construct`` returns, from the
        greedy Q8 head (``greedy_head_ready`` only; ``kernels.greedy_head``): rows not in ``logit_rows`` get 0, as
        the argmax of their NaN logits would be."""
        x, aux = self.hidden(input_ids, positions, mask, cache_rows)
        if self.tied_custom:  # the norm inside the kernel, as the tied logits kernel takes it
            token = self.greedy_head(x, self.tied_kernel.packed_weight, self.model.norm.weight, self.tied_kernel.eps,
                                     logit_rows)
        else:  # the untied head's input: the norm's output, as construct hands it to the logits kernel
            token = self.greedy_head(self.model.norm(x), self.lm_head.kernel.packed_weight, None, None, logit_rows)
        return token, aux

    def layers_one_by_one(self, input_ids, positions, mask, cache_rows):
        """The decoder stack one op per layer: ``(hidden after the last layer [B, T, H], aux [B, T, A H])``, what
        ``DecoderStackKernel`` computes in one op when every layer is fused (tests compare the two bit for bit)."""
        b, t = input_ids.shape
        x = self.model.embed_tokens(input_ids)  # [B, T, H]
        cos = ops.gather(self.cos_table, positions, 0).reshape(b, 1, t, -1)  # [B, 1, T, D]
        sin = ops.gather(self.sin_table, positions, 0).reshape(b, 1, t, -1)
        write_idx = write_index(cache_rows, self.num_kv_heads)
        inputs = ()  # the hidden state entering each layer
        for layer in self.model.layers:
            inputs = inputs + (x,)
            x = layer(x, cos, sin, mask, write_idx)
        taps = tuple(inputs[i] for i in self.aux_ids)  # in aux_layer_ids order, repeats allowed
        return x, ops.concat(taps, -1)

    def pack_kernel(self, native: dict | None = None) -> None:
        """Pack the tied LM head's kernel from the embedding table (``kernels.pack_weights`` calls this): its GGUF
        blocks when ``native`` has them (the table's rows are the head's output columns), else the dense table."""
        if self.tied_custom:
            blocks = (native or {}).get(self.model.embed_tokens.weight.name)
            if blocks is None or not self.tied_kernel.pack_native([blocks]):
                self.tied_kernel.pack(self.model.embed_tokens.weight.asnumpy())

    def after_pack(self) -> None:
        """Once every kernel is packed (``kernels.pack_weights``): the greedy Q8 head where the LM head is a native
        Q8 kernel or a dense fp32 / bf16 one (through its Q8 copy), without bias (tied: the embedding table; untied:
        ``output.weight``), with finite weights, and it is fast here."""
        head = self.lm_head_kernel()
        if head is None or not greedy_head_fast():
            return
        try:  # the kernel checks the head (format, bias, finite weights) as it reads its weights, once
            self.greedy_head = GreedyQ8HeadKernel(head)
        except HeadNotServed:
            return  # greedy forwards keep the logits
        self.greedy_head_ready = True

    def lm_head_kernel(self):
        """The custom kernel that computes the logits (tied, or untied without a bias), or None."""
        if self.tied_custom:
            return self.tied_kernel
        return self.lm_head.kernel if self.untied_rows else None

    def weight_parameters(self) -> dict:
        """Name -> Parameter for every checkpointed weight (KV cache buffers and packed kernel copies excluded)."""
        return {p.name: p for p in self.get_parameters()
                if not p.name.endswith(("k_cache", "v_cache", "packed_weight", "packed_pairs", "packed_colabs"))}

    def cache_parameters(self) -> list:
        """The per-layer ``(k_cache, v_cache)`` Parameter pairs, in layer order."""
        return [(layer.self_attn.k_cache, layer.self_attn.v_cache) for layer in self.model.layers]

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(p.shape) for name, p in self.weight_parameters().items()}


__all__ = ["PanguForCausalLM"]

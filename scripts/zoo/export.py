#!/usr/bin/env python3
"""Export a zoo of small models as torch's exporters write them, for scripts/zoo_check.py.

    python3 scripts/zoo/export.py OUT_DIR [--max-bytes 1600000] [--full] [--torchscript-only]
        [ID_PREFIX...]

Needs torch, torchvision, torchaudio, transformers, onnx and onnxruntime (the GPU machine
has them; no network is needed: every model is built from a small configuration with
random weights, seeded). Each family is exported twice, with the TorchScript exporter
(`dynamo=False`, id without suffix) and with torch's default dynamo exporter (id `_dyn`),
with a dynamic batch and ragged extent. An export is kept when ONNX Runtime runs it on one
sample at two of the manifest's sizes and on a batch of two of the same size (a model
exported with its batch fixed at 1 is kept too, marked `"batch_one": true`: the ragged
run must refuse it), and its file is at most --max-bytes.

`--full` exports instead torchvision's classification families at their full size (the
smallest of each: `tvf_` ids, random weights, 224 px high, the width ragged; tens to
hundreds of MB each, for the GPU machine's disk, not the repository) and its
segmentation models: what preparation time and exactness look like on real sizes.

Writes OUT_DIR/manifest.json as ../shared/zoo's: per model `id`, `file`, `ragged`
(INPUT:AXIS), `fact` (the ragged input's fact), `sizes` (one ragged extent per sample),
`extra` (other inputs: `ones_like_ids`, `zeros_like_ids`), `task`; and `failed`: the
exports that did not run, with the first line of their error.
"""
import argparse
import json
import os

import numpy as np
import onnxruntime as ort
import torch

TEXT_SIZES = [16, 5, 40, 23]
# Token ids are drawn in 5..VOCAB (scripts/zoo_check.py draws them in 5..999: the manifest
# says `vocab`).
VOCAB = 256
AUDIO_SIZES = [4000, 2500, 6000, 1600]
FRAME_SIZES = [100, 57, 160, 33]
IMAGE_SIZES = [64, 40, 96, 33]


class Text(torch.nn.Module):
    """A transformers encoder as a function of its ids and mask: its last hidden state."""

    def __init__(self, model, token_types=False):
        super().__init__()
        self.m = model
        self.token_types = token_types

    def forward(self, input_ids, attention_mask):
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask)
        if self.token_types:
            kwargs["token_type_ids"] = torch.zeros_like(input_ids)
        return self.m(**kwargs).last_hidden_state


class Hidden(torch.nn.Module):
    """A model of one input returning `.last_hidden_state` (audio encoders)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        out = self.m(x)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


class First(torch.nn.Module):
    """A model whose output is a tuple or a dict: its first tensor."""

    def __init__(self, model, key=None):
        super().__init__()
        self.m = model
        self.key = key

    def forward(self, x):
        out = self.m(x)
        if self.key is not None:
            return out[self.key]
        return out[0] if isinstance(out, (tuple, list)) else out


def text_models():
    import transformers as tf

    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)
    yield "hf_bert", lambda: Text(tf.BertModel(tf.BertConfig(**small)), True)
    yield "hf_distilbert", lambda: Text(tf.DistilBertModel(tf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64)))
    yield "hf_roberta", lambda: Text(tf.RobertaModel(tf.RobertaConfig(**{**small, "max_position_embeddings": 66})))
    yield "hf_xlm_roberta", lambda: Text(tf.XLMRobertaModel(tf.XLMRobertaConfig(**{**small, "max_position_embeddings": 66})))
    yield "hf_albert", lambda: Text(tf.AlbertModel(tf.AlbertConfig(**small, embedding_size=16)), True)
    yield "hf_electra", lambda: Text(tf.ElectraModel(tf.ElectraConfig(**small, embedding_size=16)), True)
    yield "hf_deberta_v2", lambda: Text(tf.DebertaV2Model(tf.DebertaV2Config(
        **small, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"])))
    yield "hf_deberta", lambda: Text(tf.DebertaModel(tf.DebertaConfig(
        **small, relative_attention=True, pos_att_type=["p2c", "c2p"])))
    yield "hf_mpnet", lambda: Text(tf.MPNetModel(tf.MPNetConfig(**small)))
    yield "hf_squeezebert", lambda: Text(tf.SqueezeBertModel(tf.SqueezeBertConfig(
        **small, embedding_size=32)), True)
    yield "hf_convbert", lambda: Text(tf.ConvBertModel(tf.ConvBertConfig(**small, embedding_size=32)), True)
    yield "hf_t5_encoder", lambda: Text(tf.T5EncoderModel(tf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=16, relative_attention_max_distance=32)))
    yield "hf_gpt2", lambda: Text(tf.GPT2Model(tf.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)))
    yield "hf_bart_encoder", lambda: Text(tf.BartModel(tf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64)).get_encoder())
    yield "hf_longformer", lambda: Text(tf.LongformerModel(tf.LongformerConfig(
        **{**small, "max_position_embeddings": 66}, attention_window=8)))


def audio_models():
    import transformers as tf
    import torchaudio

    conv = dict(conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
                hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    yield "hf_wav2vec2", lambda: Hidden(tf.Wav2Vec2Model(tf.Wav2Vec2Config(**conv)))
    yield "hf_wav2vec2_layer_norm", lambda: Hidden(tf.Wav2Vec2Model(tf.Wav2Vec2Config(
        **conv, feat_extract_norm="layer", do_stable_layer_norm=True)))
    yield "hf_hubert", lambda: Hidden(tf.HubertModel(tf.HubertConfig(**conv)))
    yield "hf_wavlm", lambda: Hidden(tf.WavLMModel(tf.WavLMConfig(**conv, num_buckets=32, max_bucket_distance=64)))
    yield "ta_convtasnet", lambda: torchaudio.models.ConvTasNet(
        num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3,
        msk_num_feats=16, msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=1)
    # Its widths are fixed (250 to 2000 channels): every conv at a tenth of them.
    yield "ta_wav2letter", lambda: _scaled(torchaudio.models.Wav2Letter(
        num_classes=20, input_type="mfcc", num_features=40), 10, inputs=40, classes=20)
    yield "ta_deepspeech", lambda: torchaudio.models.DeepSpeech(n_feature=40, n_hidden=32, n_class=20)
    yield "ta_wav2vec2", lambda: First(torchaudio.models.wav2vec2_model(
        extractor_mode="group_norm", extractor_conv_layer_config=[(16, 10, 5), (16, 4, 4), (16, 4, 4)],
        extractor_conv_bias=False, encoder_embed_dim=48, encoder_projection_dropout=0.0,
        encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2,
        encoder_num_heads=4, encoder_attention_dropout=0.0, encoder_ff_interm_features=96,
        encoder_ff_interm_dropout=0.0, encoder_dropout=0.0, encoder_layer_norm_first=False,
        encoder_layer_drop=0.0, aux_num_out=None))
    # Whisper's encoder takes its fixed frame count only (`2 * max_source_positions`): a
    # batch of same-length samples; its batch axis alone is dynamic.
    yield "hf_whisper_encoder", lambda: Hidden(tf.WhisperModel(tf.WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=50, max_target_positions=32, pad_token_id=1, bos_token_id=2,
        eos_token_id=2, decoder_start_token_id=3)).get_encoder())
    yield "hf_speech2text_encoder", lambda: Hidden(tf.Speech2TextModel(tf.Speech2TextConfig(
        vocab_size=100, d_model=48, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, input_feat_per_channel=16,
        conv_channels=32, max_source_positions=512, max_target_positions=64)).get_encoder())


def vision_models():
    import torchvision.models as tvm
    from torchvision.models import (convnext, efficientnet, mobilenetv3, regnet, resnet,
                                    swin_transformer)

    yield "tv_resnet", lambda: _narrow_resnet()
    yield "tv_mobilenet_v3", lambda: tvm.MobileNetV3(
        *mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25), num_classes=10)
    yield "tv_efficientnet", lambda: tvm.EfficientNet(
        efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)[0],
        dropout=0.0, num_classes=10)
    yield "tv_regnet_y", lambda: tvm.RegNet(regnet.BlockParams.from_init_params(
        depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25), num_classes=10, stem_width=8)
    yield "tv_shufflenet_v2", lambda: tvm.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10)
    yield "tv_mnasnet", lambda: tvm.MNASNet(0.25, num_classes=10)
    yield "tv_mobilenet_v2", lambda: tvm.MobileNetV2(num_classes=10, width_mult=0.25)
    yield "tv_regnet_x", lambda: tvm.RegNet(regnet.BlockParams.from_init_params(
        depth=4, w_0=8, w_a=8.0, w_m=2.0, group_width=8), num_classes=10, stem_width=8)
    yield "tv_convnext", lambda: tvm.ConvNeXt(
        [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 1)], num_classes=10)
    yield "tv_densenet", lambda: tvm.DenseNet(
        growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2, num_classes=10)
    yield "tv_googlenet", lambda: _scaled(tvm.GoogLeNet(
        num_classes=10, aux_logits=False, init_weights=True), 8, classes=10)
    yield "tv_inception", lambda: _scaled(tvm.Inception3(
        num_classes=10, aux_logits=False, init_weights=True), 16, classes=10)
    yield "tv_squeezenet", lambda: _scaled(tvm.SqueezeNet("1_0", num_classes=10), 4, classes=10)
    yield "tv_resnext", lambda: _scaled(tvm.ResNet(
        resnet.Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=16, num_classes=10), 8)
    yield "tv_wide_resnet", lambda: _scaled(tvm.ResNet(
        resnet.Bottleneck, [1, 1, 1, 1], width_per_group=128, num_classes=10), 16)
    yield "tv_efficientnet_v2", lambda: _efficientnet_v2()
    yield "tv_alexnet", lambda: _scaled(tvm.AlexNet(num_classes=10), 16, classes=10)
    yield "tv_swin", lambda: tvm.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=10)
    yield "tv_swin_v2", lambda: tvm.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        stochastic_depth_prob=0.0, num_classes=10,
        block=swin_transformer.SwinTransformerBlockV2,
        downsample_layer=swin_transformer.PatchMergingV2)
    # Position tables of a fixed grid: a fixed size.
    yield "tv_maxvit", lambda: tvm.MaxVit(
        input_size=(64, 64), stem_channels=8, partition_size=4, block_channels=[16, 32],
        block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0, num_classes=10)
    yield "tv_vit", lambda: _random_head(tvm.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
        num_classes=10))
    # (Its builder takes no width multiplier: every conv at an eighth of its channels.)
    yield "tv_lraspp", lambda: First(_scaled(tvm.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3), 8, classes=3), "out")
    yield "tv_deeplabv3", lambda: First(_deeplab(), "out")
    yield "tv_fcn", lambda: First(_scaled(tvm.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=3), 16, classes=3), "out")


# The smallest model of each of torchvision's classification families.
FULL_CLASSIFIERS = [
    "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
    "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small",
    "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "squeezenet1_0", "swin_t", "swin_v2_t", "vit_b_16",
    "wide_resnet50_2", "alexnet",
]
FULL_SEGMENTERS = ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "fcn_resnet50"]


def full_vision_models():
    import torchvision.models as tvm

    for name in FULL_CLASSIFIERS:
        yield "tvf_" + name, (lambda n=name: getattr(tvm, n)(weights=None))
    for name in FULL_SEGMENTERS:
        yield "tvf_" + name, (lambda n=name: First(
            getattr(tvm.segmentation, n)(weights=None, weights_backbone=None), "out"))


def _narrow_resnet():
    from torchvision.models.resnet import ResNet, BasicBlock

    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    # Narrow: every conv and norm rebuilt at an eighth of its channels.
    return _scaled(model, 8)


def _scaled(model, factor, inputs=3, classes=None):
    """`model` with every conv, norm and linear at 1/factor of its channels, but the
    `inputs` channels the model reads and the `classes` it writes; dilations kept, a
    depthwise conv still depthwise."""
    import copy

    def narrow(c, keep):
        return c if c == keep else max(c // factor, 1)

    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (torch.nn.Conv1d, torch.nn.Conv2d)):
                cin = narrow(child.in_channels, inputs)
                cout = narrow(child.out_channels, classes)
                if child.groups > 1 and child.groups == child.in_channels:
                    groups = cin
                elif cin % child.groups == 0 and cout % child.groups == 0:
                    groups = child.groups
                else:
                    groups = 1
                new = type(child)(cin, cout, child.kernel_size, child.stride, child.padding,
                                  dilation=child.dilation, groups=groups,
                                  bias=child.bias is not None)
                setattr(module, child_name, new)
            elif isinstance(child, torch.nn.BatchNorm1d):
                setattr(module, child_name, torch.nn.BatchNorm1d(max(child.num_features // factor, 1)))
            elif isinstance(child, torch.nn.BatchNorm2d):
                setattr(module, child_name, torch.nn.BatchNorm2d(max(child.num_features // factor, 1)))
            elif isinstance(child, torch.nn.Linear):
                # (Without `classes`, a classifier's outputs as they are.)
                out = child.out_features if classes is None else narrow(child.out_features, classes)
                setattr(module, child_name, torch.nn.Linear(max(child.in_features // factor, 1), out))
    return model


def _random_head(vit):
    """torchvision's ViT starts with a head of zeros: every output 0, whatever the input."""
    torch.nn.init.normal_(vit.heads.head.weight, std=0.5)
    return vit


def _efficientnet_v2():
    import torchvision.models as tvm
    from torchvision.models import efficientnet

    setting, last = efficientnet._efficientnet_conf("efficientnet_v2_s")
    model = tvm.EfficientNet(setting, dropout=0.0, num_classes=10, last_channel=last)
    return _scaled(model, 8, classes=10)


def _deeplab():
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
    return _scaled(model, 8, classes=3)


def spec(id_):
    """Inputs, ragged spec, fact, sizes, extra and task of a family, by its id."""
    if id_.startswith("hf_") and id_ not in AUDIO_IDS:
        return dict(inputs=["input_ids", "attention_mask"], ragged="input_ids:1", fact="N,L,i64",
                    sizes=TEXT_SIZES, extra={"attention_mask": "ones_like_ids"},
                    task="text encoder, last hidden state")
    if id_ == "hf_speech2text_encoder":
        return dict(inputs=["x"], ragged="x:1", fact="N,T,16,f32", sizes=FRAME_SIZES, extra={},
                    task="speech encoder over filterbank frames")
    if id_ == "hf_whisper_encoder":
        return dict(inputs=["x"], ragged="x:2", fact="N,16,100,f32", sizes=[100] * 4, extra={},
                    task="speech encoder at its fixed frame count (Whisper)", fixed=True)
    if id_ in ("tv_maxvit", "tv_vit"):
        side = 64 if id_ == "tv_maxvit" else 32
        return dict(inputs=["x"], ragged="x:3", fact=f"N,3,{side},{side},f32", sizes=[side] * 4,
                    extra={}, task="image model of a fixed size", fixed=True)
    if id_ == "tv_inception":
        # Its stem takes 75 px at the least.
        return dict(inputs=["x"], ragged="x:3", fact="N,3,96,W,f32", sizes=[96, 80, 128, 75],
                    extra={}, task="image model, width ragged")
    if id_ in ("tv_lraspp", "tv_deeplabv3", "tv_fcn"):
        # Widths of every residue: their resizes to another map's extents size each image
        # to its own.
        return dict(inputs=["x"], ragged="x:3", fact="N,3,64,W,f32", sizes=[64, 37, 90, 21],
                    extra={}, task="segmentation, width ragged")
    if id_ in ("ta_wav2letter",):
        return dict(inputs=["x"], ragged="x:2", fact="N,40,T,f32", sizes=FRAME_SIZES, extra={},
                    task="speech CTC over MFCC frames")
    if id_ == "ta_deepspeech":
        return dict(inputs=["x"], ragged="x:2", fact="N,1,T,40,f32", sizes=FRAME_SIZES, extra={},
                    task="speech CTC (DeepSpeech)")
    if id_ == "ta_convtasnet":
        # As exported it takes multiples of its encoder's stride only: the fact says so.
        return dict(inputs=["x"], ragged="x:2", fact="N,1,8*T,f32", sizes=[8000, 5000, 12000, 3200],
                    extra={}, task="source separation (Conv-TasNet)")
    if id_ in AUDIO_IDS:
        return dict(inputs=["x"], ragged="x:1", fact="N,T,f32", sizes=AUDIO_SIZES, extra={},
                    task="speech encoder over a waveform")
    if id_.startswith("tvf_"):
        high = 299 if id_ == "tvf_inception_v3" else 224
        # Position embeddings of a fixed grid: one width only.
        fixed = id_.startswith(("tvf_vit", "tvf_maxvit"))
        # Segmenters resize their maps to other maps' extents: any width (one not a
        # multiple of 16 among them).
        last = 197 if id_[4:] in FULL_SEGMENTERS else 200
        return dict(inputs=["x"], ragged="x:3", fact=f"N,3,{high},W,f32",
                    sizes=[high] * 4 if fixed else [high, 160, 288, last], extra={},
                    task="torchvision at full size, width ragged")
    return dict(inputs=["x"], ragged="x:3", fact="N,3,64,W,f32", sizes=IMAGE_SIZES, extra={},
                task="image model, width ragged")


AUDIO_IDS = {"hf_wav2vec2", "hf_wav2vec2_layer_norm", "hf_hubert", "hf_wavlm", "ta_wav2vec2",
             "hf_speech2text_encoder", "hf_whisper_encoder"}


def example(s, size, batch, rng):
    *dims, dt = s["fact"].split(",")
    shape = [batch] + [int(d) if d.isdigit() else size for d in dims[1:]]
    if dt == "i64":
        x = rng.integers(5, VOCAB, size=shape).astype(np.int64)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    feeds = {s["inputs"][0]: x}
    for name, how in s["extra"].items():
        feeds[name] = np.ones_like(x) if how == "ones_like_ids" else np.zeros_like(x)
    return feeds


def calibrated(model, s):
    """`model` in eval mode, its batch norms' running statistics those of random samples.

    Freshly built, a norm's statistics are 0 and 1, and through a narrowed network of
    random weights the activations then fade: the outputs of several torchvision families
    hardly depended on their input (1e-10 of spread), so no check could tell a wrong
    batch from a right one. Measured on a few random batches, each norm keeps its
    activations near unit scale, and the outputs depend on the input."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        rng = np.random.default_rng(2)
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        with torch.no_grad():
            for _ in range(4):
                feeds = example(s, s["sizes"][0], 4, rng)
                model(*(torch.from_numpy(feeds[n]) for n in s["inputs"]))
    return model.eval()


def export(model, s, path, dynamo):
    rng = np.random.default_rng(0)
    feeds = example(s, s["sizes"][0], 2, rng)
    args = tuple(torch.from_numpy(feeds[n]) for n in s["inputs"])
    axis = int(s["ragged"].split(":")[1])
    # A model of a fixed extent (`fixed`) has its batch axis alone dynamic.
    ragged = {} if s.get("fixed") else {axis: "L"}
    axes = {n: {0: "N", **ragged} for n in s["inputs"]}
    # (Positional: the models' own forward arguments are named each their way.)
    kwargs = dict(input_names=s["inputs"], output_names=["y"], opset_version=17)
    if dynamo:
        from torch.export import Dim

        ragged = {} if s.get("fixed") else {axis: Dim.DYNAMIC}
        shapes = tuple({0: Dim.DYNAMIC, **ragged} for _ in s["inputs"])
        torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=shapes,
                          external_data=False, **kwargs)
    else:
        torch.onnx.export(model, args, path, dynamo=False, dynamic_axes=axes, **kwargs)


def check(path, s):
    """ONNX Runtime on one sample at two sizes, and on a batch of two: whether the batch runs."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    names = [i.name for i in sess.get_inputs()]
    for size in s["sizes"][:2]:
        feeds = example(s, size, 1, rng)
        sess.run(None, {n: feeds[n] for n in names})
    try:
        feeds = example(s, s["sizes"][1], 2, rng)
        sess.run(None, {n: feeds[n] for n in names})
        return True
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-bytes", type=int, default=1_600_000)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--torchscript-only", action="store_true")
    ap.add_argument("prefixes", nargs="*")
    a = ap.parse_intermixed_args()
    os.makedirs(a.out, exist_ok=True)
    manifest = {"models": [], "failed": {}, "torch": torch.__version__}
    if a.full:
        families = [*full_vision_models()]
    else:
        families = [*text_models(), *audio_models(), *vision_models()]
    for id_, build in families:
        if a.prefixes and not any(id_.startswith(p) for p in a.prefixes):
            continue
        s = spec(id_)
        for dynamo in (False,) if a.torchscript_only else (False, True):
            mid = id_ + ("_dyn" if dynamo else "")
            path = os.path.join(a.out, mid + ".onnx")
            try:
                torch.manual_seed(0)
                model = calibrated(build(), s)
                with torch.no_grad():
                    export(model, s, path, dynamo)
                size = os.path.getsize(path)
                if size > a.max_bytes:
                    raise RuntimeError(f"{size} bytes, above {a.max_bytes}")
                batches = check(path, s)
                entry = dict(id=mid, file=mid + ".onnx", ragged=s["ragged"], fact=s["fact"],
                             sizes=s["sizes"], extra=s["extra"], task=s["task"])
                if s["fact"].endswith("i64"):
                    entry["vocab"] = VOCAB
                if not batches:
                    entry["batch_one"] = True
                manifest["models"].append(entry)
                print(f"{mid:32} ok ({size} bytes){'' if batches else ', batch fixed at 1'}", flush=True)
            except Exception as e:
                line = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                manifest["failed"][mid] = f"{type(e).__name__}: {line}"
                print(f"{mid:32} failed: {manifest['failed'][mid]}", flush=True)
                if os.path.exists(path):
                    os.remove(path)
                data = path + ".data"
                if os.path.exists(data):
                    os.remove(data)
            # Written after each export: a run cut short keeps what it made.
            with open(os.path.join(a.out, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()

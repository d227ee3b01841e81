"""Text lines recognised at scale with Ray Data: PNG images of lines from a folder,
PP-OCRv4 rec in exact ragged batches (one actor per GPU, or two on the CPU), the text of
each line written to Parquet.

    pip install "ray[data]" pillow
    python examples/ray_lines.py fixtures/lines assets/ppocr/ch_PP-OCRv4_rec_infer.onnx \
        /tmp/lines.parquet [--runtime cuda --actors 2 --gpus-per-actor 1]

Each line is scaled to height 48 and normalised as PaddleOCR does, any width kept; the
model's outputs are reduced on the fly to each step's best class (top_k=1), which greedy
CTC decoding reads.
"""

import argparse

import numpy as np
import ray

import tract_ragged
from tract_ragged.ray import Predictor


def to_input(batch):
    """PaddleOCR's recogniser input: height 48, any width, CHW, in [-1, 1]."""
    from PIL import Image

    out = np.empty(len(batch["image"]), dtype=object)
    for i, img in enumerate(batch["image"]):
        img = np.asarray(img)
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        h, w = img.shape[:2]
        width = max(1, round(w * 48 / h))
        img = np.asarray(Image.fromarray(img[..., :3]).resize((width, 48), Image.BILINEAR))
        out[i] = ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1).copy()
    return {"path": batch["path"], "x": out}


def decoder(classes, positions):
    def decode(batch):
        texts = []
        for best in batch[positions]:
            best = np.asarray(best).reshape(-1)
            chars, last = [], -1
            for c in best:
                if c != last and c != 0:
                    chars.append(classes[c] if c < len(classes) else "?")
                last = c
            texts.append("".join(chars))
        return {"path": batch["path"], "text": np.array(texts, dtype=object)}

    return decode


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines")
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--runtime", default="cpu")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--gpus-per-actor", type=float, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    # A CPU for each actor, and two for reading and decoding beside them.
    ray.init(num_cpus=args.actors + 2, include_dashboard=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    # The dictionary, and the name of the best classes' output, from the model itself.
    model = tract_ragged.Model(args.model, "x:3", input_fact="N,3,48,W,f32", top_k=1)
    classes = [""] + model.metadata["character"].splitlines() + [" "]
    values, positions = model.outputs
    del model
    (
        ray.data.read_images(args.lines, include_paths=True, mode="RGB")
        .map_batches(to_input, batch_format="numpy")
        .map_batches(
            Predictor,
            fn_constructor_kwargs=dict(path=args.model, ragged="x:3",
                                       input_fact="N,3,48,W,f32", runtime=args.runtime,
                                       top_k=1),
            batch_size=args.batch_size,
            concurrency=args.actors,
            num_gpus=args.gpus_per_actor or None,
            batch_format="numpy",
        )
        .map_batches(decoder(classes, positions), batch_format="numpy")
        .write_parquet(args.out)
    )
    ray.shutdown()


if __name__ == "__main__":
    main()

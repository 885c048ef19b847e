// Package models holds model manifests: the ordered list of a network's
// trainable parameters (name and shape) that a data-parallel reducer sees,
// without any weights.
//
// A manifest is JSON:
//
//	{
//	  "model":  "resnet50",
//	  "source": "where the list comes from",
//	  "dtype":  "float32",
//	  "order":  "registration (forward) order",
//	  "params": [{"name": "conv1.weight", "shape": [64, 3, 7, 7]}, ...]
//	}
//
// Parameters are listed in registration (forward) order, the order of
// PyTorch's named_parameters(); a backward pass produces gradients roughly
// in the reverse order. Three manifests are built in: "resnet50"
// (torchvision), "bert-base" and "gpt2-small" (lm_head tied to the token
// embedding, so not listed). Load accepts a built-in name or the path of a
// regular file of at most MaxFileSize (64 MiB) bytes. docs/guide/models.md
// describes the format for people writing one, and how to export one from a
// PyTorch or a GoMLX model.
//
// Parse validates everything a benchmark relies on and reports the file,
// the line and the JSON field at fault, for example
// `my.json:7: params[3].shape[1]: "fc.weight" has a dimension of size 0; every size must be at least 1`.
// Sizes are checked without overflow: no parameter and no manifest may
// hold more than MaxNumel (2^40) elements.
package models

//! The long help of `syncmem train`: the model, fusion, and the schemas of the text report,
//! `--json` and `--snapshot`.

/// Printed after the options by `syncmem train --help`.
pub(super) const AFTER_HELP: &str = "\
The model is an MLP D -> H -> H -> C (ReLU) built from operators: FC, Relu, FC, Relu, FC,
SoftmaxWithLoss, Accuracy; then SoftmaxWithLossGradient, FCGradient, ReluGradient; then the
update of each parameter: SGD, MomentumSGD or Adam (--optimizer; the state of the last two, one
and two tensors per parameter, is zero-filled by the init net and stays on the device; with
--offload optimizer it lives in host memory and the update runs on the host, each step moving
the gradients down and the parameters up, with no overlap with the device's work). Data,
weights and activations stay on the device: each step shares one uploaded batch (no copy) and
reads back only the loss and accuracy scalars. With --offload parameters the weights leave the
device between steps: each step queues their copies to the device on a copy stream of its own
before the forward pass (each operator waits for its own weights' copy only) and writes them
back after the update, freeing their device memory (the transfers count both ways). Memory saved by planning is measured on one step
with and without it, in fresh workspaces.

Fusion (on by default, off with --no-fuse; the results are the same bit for bit): each FC whose
output only a Relu reads applies the ReLU in its GEMM (no fc1, fc2 blobs), and each FCGradient
whose dX only a ReluGradient reads applies the ReLU mask in its dX GEMM (no relu1_grad,
relu2_grad blobs), the six SGD updates run as one SGD over every (parameter, gradient) pair,
one kernel launch on a device (a parameter of 16384 values or more gets a launch of its own on
OpenCL; MomentumSGD and Adam updates merge into operators of five and four parameters, which
launch their kernel once per parameter), the Accuracy and SoftmaxWithLossGradient run inside
the SoftmaxWithLoss (one pass over the rows), and each FCGradient writes its bias gradient (the
column sums of dY) in its dW GEMM's launch: 8 operators and 10 kernel launches per step at
hidden 64 with SGD, against 19 and 24 unfused.

Human output: one line per epoch (mean loss and accuracy of its steps, seconds; then the loss
and accuracy on the held-out set, with one), the final loss and accuracy over the whole
training set (and over the held-out set), a table of blobs (type, dims, bytes, capacity, head, copies
made by each buffer), transfers, memory peaks per device, the memory summary of the device pool
(in the style of torch.cuda.memory_summary(), with a legend) and the memory saved by planning.

JSON output (--json), one object:
  {\"device\": string (the first device trained on: it holds the parameters),
   \"devices\": [string] (every device trained on; several: data-parallel),
   \"note\": string | null,
   \"data\": {\"source\": \"spirals\" | path, \"samples\" (trained on: without the held-out
      ones of --validation-split), \"features\", \"classes\"},
   \"model\": {\"widths\": [D, H, H, C], \"parameters\"},
   \"settings\": {\"epochs\", \"batch\", \"lr\", \"optimizer\": \"sgd\" | \"momentum\" | \"adam\",
      \"offload_optimizer\": bool, \"offload_parameters\": bool, \"offload_activations\": bool,
      \"seed\", \"plan\": bool, \"fuse\": bool},
   \"epochs\": [{\"epoch\", \"loss\", \"accuracy\", \"steps\", \"seconds\",
      \"held_out\": {\"loss\", \"accuracy\"} | null (the held-out set after the epoch)}],
   \"final\": {\"loss\", \"accuracy\"} (over the training data),
   \"held_out\": {\"source\": path | \"validation split\", \"samples\", \"fraction\": F | null,
      \"loss\", \"accuracy\"} | null (the held-out set at the end: --test-data, or
      --validation-split F; never trained on; evaluated on the device holding the
      parameters),
   \"seconds\": total,
   \"transfers\": {\"steps\": count, \"setup\", \"training\", \"per_step\", \"max_step\", \"eval\",
      \"process_training\", \"process\"},
      each but steps a {\"host_to_device\": {\"count\", \"bytes\"}, \"device_to_host\": {...},
      \"device_to_device\": {...}, \"mapped\", \"spilled\", \"refilled\"}: copies during setup
      (the run's buffers), all steps, one step on average, the worst step (the copies of the
      thread running a step), the final evaluation (the run's buffers); then every copy the
      process made during the steps and during the whole run; \"mapped\" counts zero-copy
      syncs (host and device share the memory: no byte copied), \"spilled\" and \"refilled\"
      the dirty mirrors written back to the host under --memory-cap and brought back,
   \"device_pairs\": [{\"from\", \"to\", \"direct\": bool (one device command, or through the
      host), \"count\", \"bytes\", \"count_per_step\", \"bytes_per_step\"}]: copies between
      devices during the steps, per pair and route (empty on one device),
   \"memory_cap\": {\"cap\": bytes | null, \"spills_per_step\", \"spilled_bytes_per_step\",
      \"refills_per_step\", \"refilled_bytes_per_step\", \"spills\", \"refills\"} (during the
      steps; fractions per step),
   \"activations\": {\"planned\", \"offloads_per_step\", \"released_bytes_per_step\",
      \"down_bytes_per_step\", \"up_bytes_per_step\", \"refills\", \"not_ready\"} | null: what
      --offload activations moved (values that left the device, the device bytes they released,
      the bytes copied each way, the copies back and those still running when their reader
      started),
   \"parameters\": {same fields} | null: what --offload parameters moved within the steps (each
      weight brought up ahead of its first reader, and back after its update),
   \"waits\": {\"per_step\", \"max_step\", \"total\"}: host waits on device work during the
      steps (event waits, blocking reads, queue finishes; counted by the library),
   \"heap_allocations\": {\"per_step\", \"max_step\" (over the steps after the first),
      \"first_step\", \"steps\"}: heap allocations of the process during each step (the
      binary's global allocator counts them),
   \"blobs\": [{\"name\", \"dtype\", \"dims\", \"bytes\", \"capacity\", \"head\": \"host\" | \"device\" |
      \"synced\" | \"uninitialized\" | \"none\", \"host\": bool, \"device\": bool (mirror allocated),
      \"host_to_device\", \"device_to_host\", \"mapped\"}],
   \"memory\": [{\"label\", \"in_use\", \"peak\"}]  (host, then each device; peaks since setup),
   \"saved\": {\"file\", \"tensors\": [names]} | null  (the parameters written by --save),
   \"memory_summary\": {...} | null  (the device pool at the end, as the human summary shows it:
      \"label\", \"kind\", \"small_size\" (blocks up to it are small), then \"allocated\",
      \"requested\", \"reserved\", \"inactive_split\", each {\"all\", \"small\", \"large\"} of
      {\"current\", \"peak\", \"allocated\", \"freed\"} bytes (peaks since training started;
      allocated and freed are cumulative), \"segments\": {\"all\", \"small\", \"large\"},
      \"allocations\", \"frees\", \"cache_hits\", \"backend_allocs\", \"backend_frees\",
      \"alloc_retries\", \"ooms\", \"free_bytes\", \"largest_free_block\", \"cap\" (null: none),
      \"direct_bytes\", \"parked_bytes\" (blocks spilled in place: reserved, not charged to the
      cap)),
   \"planning\": {\"enabled\", \"unplanned_peak\", \"planned_peak\", \"saved\" (tensor bytes on the
      device at the peak of one step), \"device_peak_unplanned\", \"device_peak_planned\" (the
      device allocator's peak), \"planned_blobs\", \"slots\",
      \"shared\": {slot name: [blob names it holds, in order]}},
   \"distributed\": {...} | null  (a rank of a distributed job; rank 0's report: \"engine\",
      \"ranks\", \"rank\", \"bucket_bytes\", \"buckets\" (elements of each, in the order
      summed), \"overlap\", \"steps\", then per step: \"bytes_per_step\" (gradient bytes
      all-reduced), \"calls_per_step\", \"allreduce_ms_per_step\", \"staging_ms_per_step\",
      \"exposed_ms_per_step\" (waited for after the step's own work),
      \"overlapped_ms_per_step\" (hidden behind backward),
      \"staging_to_device_bytes_per_step\", \"staging_to_host_bytes_per_step\")}
Accuracies are fractions (0-1); bytes are integers.

--snapshot FILE writes one JSON object: {\"device\", \"step\" (the step after which it was
taken, counted over all epochs from 1), \"pools\": [{\"label\", \"kind\", \"stats\" (the pool's
statistics at that instant), \"segments\": [{\"id\", \"size\", \"class\": \"small\" | \"large\",
\"blocks\": [{\"offset\", \"size\", \"requested\", \"state\": \"allocated\" | \"free\" |
\"pending\" (cached, work queued before its free may still run), \"stream\", \"owner\" (the
tensor or blob holding it) | null}]}]}]}: the host pool, then the device's device and pinned
pools (those used).";

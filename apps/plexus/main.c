// plexus: the command-line tool.  One binary, five subcommands (app.h).
#include "app.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "plexus %d.%d.%d: train neural networks data parallel on threads, MPI or Slurm\n"
          "\n"
          "usage: plexus COMMAND [OPTIONS]\n"
          "\n"
          "commands:\n"
          "  train      train a model of the zoo from a JSON config and/or long options, with\n"
          "             evaluation, checkpoints, resume and logs (console, JSONL, TensorBoard)\n"
          "  eval       evaluate a checkpoint on the held-out (or training) split\n"
          "  generate   sample text from a language-model checkpoint\n"
          "  inspect    list a safetensors file's tensors, or a checkpoint's files and training state\n"
          "  tokenize   turn a text file into token shards and a vocabulary\n"
          "  checkpoint consolidate CKPT --out FILE: the whole model of a checkpoint of any layout, one file\n"
          "  schedule   print a pipeline schedule (gpipe, 1f1b, interleaved) as a per-rank table, with its bubble\n"
          "  plot       draw runs' loss, evaluation and learning-rate curves into a PNG and an SVG\n"
          "\n"
          "`plexus COMMAND --help` lists a command's options with their defaults.\n"
          "Launch: `plexus train --threads 2 ...` (ranks as threads, no MPI), `mpirun -n 4 plexus train ...`,\n"
          "or `srun plexus train ...` under Slurm. Documentation: README.md and docs/ in the source tree.\n",
          PLEXUS_VERSION_MAJOR, PLEXUS_VERSION_MINOR, PLEXUS_VERSION_PATCH);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("plexus %d.%d.%d (%s)\n", PLEXUS_VERSION_MAJOR, PLEXUS_VERSION_MINOR, PLEXUS_VERSION_PATCH,
           px_comm_mpi_available() ? "with MPI" : "without MPI");
    printf("kernels: %s\nconv: %s\nblas: %s\n", px_kernel_info(), px_conv_kernel_info(), px_blas_info());
    const int gpus = px_train_cuda_devices();
    if (gpus < 0) printf("cuda: built without CUDA\n");
    else printf("cuda: %d device%s\n", gpus, gpus == 1 ? "" : "s");
    return 0;
  }
  if (strcmp(cmd, "train") == 0) return px_cmd_train(argc - 1, argv + 1);
  if (strcmp(cmd, "eval") == 0) return px_cmd_eval(argc - 1, argv + 1);
  if (strcmp(cmd, "generate") == 0) return px_cmd_generate(argc - 1, argv + 1);
  if (strcmp(cmd, "inspect") == 0) return px_cmd_inspect(argc - 1, argv + 1);
  if (strcmp(cmd, "tokenize") == 0) return px_cmd_tokenize(argc - 1, argv + 1);
  if (strcmp(cmd, "checkpoint") == 0) return px_cmd_checkpoint(argc - 1, argv + 1);
  if (strcmp(cmd, "schedule") == 0) return px_cmd_schedule(argc - 1, argv + 1);
  if (strcmp(cmd, "plot") == 0) {
#ifdef PX_HAVE_CAIRO
    return px_cmd_plot(argc - 1, argv + 1);
#else
    fprintf(stderr, "plexus plot: this plexus was built without cairo (apt-get install libcairo2-dev, then rebuild)\n");
    return 2;
#endif
  }
  fprintf(stderr,
          "plexus: unknown command \"%s\"; expected train, eval, generate, inspect, tokenize, checkpoint, schedule or "
          "plot\n",
          cmd);
  usage(stderr);
  return 2;
}

/* plexus/plexus.h — everything.  docs/ARCHITECTURE.md maps the layers. */
#ifndef PLEXUS_PLEXUS_H
#define PLEXUS_PLEXUS_H

#include "plexus/base.h"
#include "plexus/tensor.h"
#include "plexus/nn.h"
#include "plexus/optim.h"
#include "plexus/io.h"
#include "plexus/comm.h"
#include "plexus/parallel.h"
#include "plexus/pipeline.h"
#include "plexus/tensor_parallel.h"
#include "plexus/data.h"
#include "plexus/log.h"
#include "plexus/train.h"
#include "plexus/zoo.h"

#define PLEXUS_VERSION_MAJOR 0
#define PLEXUS_VERSION_MINOR 1
#define PLEXUS_VERSION_PATCH 0
#define PLEXUS_VERSION "0.1.0"

#endif

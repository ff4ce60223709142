#ifndef TESSERA_SERVER_REFLECTION_V1_H_
#define TESSERA_SERVER_REFLECTION_V1_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace tessera::server {

// gRPC server reflection, version 1 (grpc.reflection.v1.ServerReflection), from the
// descriptors linked into this process: what clients built on newer gRPC releases ask
// (grpcurl, Postman, grpc-js tooling), next to the v1alpha that grpc++_reflection serves.
// Answers every request of the protocol: a file by name or by the symbol or extension it
// defines (with the files it imports), a type's extension numbers, and `services`.
class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  explicit ReflectionV1(std::vector<std::string> services) : services_(std::move(services)) {}

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  // The answer to one request.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_REFLECTION_V1_H_

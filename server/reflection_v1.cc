#include "server/reflection_v1.h"

#include <set>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace tessera::server {
namespace {

namespace v1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// `file` and every file it imports, directly or not, each once, `file` first.
void AddFiles(const FileDescriptor* file, std::set<std::string>* seen,
              v1::FileDescriptorResponse* out) {
  if (file == nullptr || !seen->insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFiles(file->dependency(i), seen, out);
}

void SetError(grpc::StatusCode code, const std::string& message,
              v1::ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(message);
}

}  // namespace

v1::ServerReflectionResponse ReflectionV1::Answer(
    const v1::ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  v1::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  const FileDescriptor* file = nullptr;
  std::string missing;
  switch (request.message_request_case()) {
    case v1::ServerReflectionRequest::kFileByFilename:
      file = pool->FindFileByName(request.file_by_filename());
      missing = "file '" + request.file_by_filename() + "' not found";
      break;
    case v1::ServerReflectionRequest::kFileContainingSymbol:
      file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      missing = "symbol '" + request.file_containing_symbol() + "' not found";
      break;
    case v1::ServerReflectionRequest::kFileContainingExtension: {
      const auto& e = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(e.containing_type());
      const auto* extension =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, e.extension_number());
      file = extension == nullptr ? nullptr : extension->file();
      missing = "extension " + std::to_string(e.extension_number()) + " of '" +
                e.containing_type() + "' not found";
      break;
    }
    case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 "type '" + request.all_extension_numbers_of_type() + "' not found", &response);
        return response;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* f : extensions) numbers->add_extension_number(f->number());
      return response;
    }
    case v1::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      return response;
    default:
      SetError(grpc::StatusCode::UNIMPLEMENTED, "the request names no question", &response);
      return response;
  }
  if (file == nullptr) {
    SetError(grpc::StatusCode::NOT_FOUND, missing, &response);
    return response;
  }
  std::set<std::string> seen;
  AddFiles(file, &seen, response.mutable_file_descriptor_response());
  return response;
}

grpc::Status ReflectionV1::ServerReflectionInfo(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<v1::ServerReflectionResponse, v1::ServerReflectionRequest>* stream) {
  v1::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace tessera::server

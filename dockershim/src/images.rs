//! The CRI `ImageService` over Docker's images, and loading image archives.

use crate::Shim;
use crate::runtime::status;
use bollard::Docker;
use bollard::query_parameters as q;
use futures::StreamExt;
use k8s_cri::v1 as cri;
use std::path::Path;
use tonic::{Request, Response, Status};

type Answer<T> = Result<Response<T>, Status>;

/// Loads one `docker save` archive.
pub async fn load(docker: &Docker, archive: &Path) -> Result<(), crate::Error> {
    let bytes = tokio::fs::read(archive)
        .await
        .map_err(|source| crate::Error::Io {
            what: format!("reading {}", archive.display()),
            source,
        })?;
    let mut progress = docker.import_image(
        q::ImportImageOptionsBuilder::default().quiet(true).build(),
        bollard::body_full(bytes.into()),
        None,
    );
    while let Some(step) = progress.next().await {
        step?;
    }
    tracing::info!(archive = %archive.display(), "image archive loaded into docker");
    Ok(())
}

fn image_of(i: bollard::models::ImageInspect) -> cri::Image {
    cri::Image {
        id: i.id.unwrap_or_default(),
        repo_tags: i.repo_tags.unwrap_or_default(),
        repo_digests: i.repo_digests.unwrap_or_default(),
        size: u64::try_from(i.size.unwrap_or(0)).unwrap_or(0),
        ..Default::default()
    }
}

/// The CRI image service.
pub struct Images {
    shim: Shim,
}

impl Images {
    pub fn new(shim: Shim) -> Images {
        Images { shim }
    }
}

#[tonic::async_trait]
impl cri::image_service_server::ImageService for Images {
    async fn list_images(
        &self,
        _: Request<cri::ListImagesRequest>,
    ) -> Answer<cri::ListImagesResponse> {
        let found = self
            .shim
            .docker
            .list_images(None::<q::ListImagesOptions>)
            .await
            .map_err(status)?;
        Ok(Response::new(cri::ListImagesResponse {
            images: found
                .into_iter()
                .map(|i| cri::Image {
                    id: i.id,
                    repo_tags: i.repo_tags,
                    repo_digests: i.repo_digests,
                    size: u64::try_from(i.size).unwrap_or(0),
                    ..Default::default()
                })
                .collect(),
        }))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> Answer<cri::ImageStatusResponse> {
        let image = request.into_inner().image.unwrap_or_default().image;
        match self.shim.docker.inspect_image(&image).await {
            Ok(i) => Ok(Response::new(cri::ImageStatusResponse {
                image: Some(image_of(i)),
                ..Default::default()
            })),
            // Not present is an empty answer, not an error.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(Response::new(cri::ImageStatusResponse::default())),
            Err(e) => Err(status(e)),
        }
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Answer<cri::PullImageResponse> {
        let image = request.into_inner().image.unwrap_or_default().image;
        let mut progress = self.shim.docker.create_image(
            Some(
                q::CreateImageOptionsBuilder::default()
                    .from_image(&image)
                    .build(),
            ),
            None,
            None,
        );
        while let Some(step) = progress.next().await {
            step.map_err(status)?;
        }
        let pulled = self
            .shim
            .docker
            .inspect_image(&image)
            .await
            .map_err(status)?;
        Ok(Response::new(cri::PullImageResponse {
            image_ref: pulled.id.unwrap_or_default(),
        }))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> Answer<cri::RemoveImageResponse> {
        let image = request.into_inner().image.unwrap_or_default().image;
        match self
            .shim
            .docker
            .remove_image(&image, None::<q::RemoveImageOptions>, None)
            .await
        {
            Ok(_)
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(Response::new(cri::RemoveImageResponse {})),
            Err(e) => Err(status(e)),
        }
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Answer<cri::ImageFsInfoResponse> {
        Ok(Response::new(cri::ImageFsInfoResponse::default()))
    }
}
